"""The deep tier's GPU work on one node (`invoke health --deep`), run with the venv's python
as a file (the all_reduce spawns one process per GPU):

  burn       every GPU at once (one thread each) multiplies the same two fp32 matrices for
             SECONDS, as gpu-burn does: each result compared with the GPU's first (a GPU
             that gives two answers to one question is faulty), the first answers compared
             across GPUs, the TFLOPS of each;
  allreduce  one process per GPU, NCCL over 127.0.0.1, a few warm-up calls then timed
             all_reduce calls of BYTES (nccl-tests' busbw: algbw * 2(n-1)/n), the sum checked.

`--emulate N` runs both on the CPU as N devices (gloo), to see the tier work where there is
no GPU; its figures say nothing of a GPU. Prints one JSON line: {"torch", "cuda", "device",
"gpus": [{"index", "name", "tflops", "iters", "self_mismatch", "max_diff"}], "allreduce":
{"world", "bytes", "busbw_gbps", "algbw_gbps", "correct", "error"}, "error"}.
Standard library and torch only."""

import argparse
import json
import os
import socket
import sys
import threading
import time


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _burn_one(torch, dev, n, seconds, box):
    try:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        g = torch.Generator().manual_seed(1234)
        a = torch.rand(n, n, generator=g).to(dev)
        b = torch.rand(n, n, generator=g).to(dev)
        first = torch.mm(a, b)
        iters = 0
        bad = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            c = torch.mm(a, b)
            if not torch.equal(c, first):
                bad += 1
            iters += 1
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        dt = time.perf_counter() - t0
        box.update(
            tflops=round(2.0 * n**3 * iters / dt / 1e12, 4),
            iters=iters,
            self_mismatch=bad,
            first=first.float().cpu(),
        )
    except Exception as e:  # one GPU failing is that GPU's finding, not the program's
        box.update(error=f"{type(e).__name__}: {e}"[:300])


def burn(torch, devices, n, seconds):
    boxes = [dict(index=i) for i in range(len(devices))]
    threads = [
        threading.Thread(target=_burn_one, args=(torch, d, n, seconds, box))
        for d, box in zip(devices, boxes)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ref = next((b["first"] for b in boxes if "first" in b), None)
    for d, b in zip(devices, boxes):
        b["name"] = torch.cuda.get_device_name(d) if d.type == "cuda" else "cpu"
        first = b.pop("first", None)
        if first is not None and ref is not None:
            b["max_diff"] = float((first - ref).abs().max() / ref.abs().max().clamp(min=1e-30))
    return boxes


def _rank(rank, world, port, nbytes, cuda, queue):
    import torch
    import torch.distributed as dist

    try:
        if cuda:
            torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
        )
        buf = torch.empty(nbytes // 4, dtype=torch.float32, device=dev)
        for i in range(2 + 5):
            if i == 2:
                if cuda:
                    torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
            buf.fill_(rank + 1)
            dist.all_reduce(buf)
        if cuda:
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / 5
        correct = bool(torch.all(buf == world * (world + 1) / 2).item())
        dist.destroy_process_group()
        algbw = nbytes / dt / 1e9
        queue.put(
            {
                "rank": rank,
                "world": world,
                "bytes": nbytes,
                "algbw_gbps": round(algbw, 3),
                "busbw_gbps": round(algbw * 2 * (world - 1) / world, 3),
                "correct": correct,
            }
        )
    except Exception as e:
        queue.put({"rank": rank, "error": f"{type(e).__name__}: {e}"[:300]})


def allreduce(world, nbytes, cuda, timeout):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, nbytes, cuda, queue)) for r in range(world)
    ]
    for p in procs:
        p.start()
    got, deadline = [], time.monotonic() + timeout
    while len(got) < world and time.monotonic() < deadline:
        try:
            got.append(queue.get(timeout=max(0.1, deadline - time.monotonic())))
        except Exception:
            break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    errors = [g["error"] for g in got if "error" in g]
    if errors or len(got) < world:
        return {
            "world": world,
            "bytes": nbytes,
            "error": errors[0]
            if errors
            else f"{world - len(got)} of {world} ranks gave no answer within {timeout:.0f} s",
        }
    r0 = next(g for g in got if g["rank"] == 0)
    res = {k: r0[k] for k in ("world", "bytes", "algbw_gbps", "busbw_gbps")}
    res.update(correct=all(g["correct"] for g in got), error=None)
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--bytes", type=int, default=1 << 30)
    p.add_argument(
        "--size", type=int, default=0, help="matrix side (default 8192 on GPU, 256 emulated)"
    )
    p.add_argument("--emulate", type=int, default=0)
    a = p.parse_args()
    out = {
        "torch": None,
        "cuda": False,
        "device": None,
        "gpus": [],
        "allreduce": None,
        "error": None,
    }
    try:
        import torch
    except Exception as e:
        out["error"] = f"import torch: {type(e).__name__}: {e}"[:300]
        print(json.dumps(out))
        return
    out["torch"] = torch.__version__
    out["cuda"] = bool(torch.cuda.is_available())
    if a.emulate:
        torch.set_num_threads(1)
        devices = [torch.device("cpu")] * a.emulate
    elif out["cuda"]:
        devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    else:
        print(json.dumps(out))
        return
    out["device"] = devices[0].type
    n = a.size or (256 if a.emulate else 8192)
    out["gpus"] = burn(torch, devices, n, a.seconds)
    if len(devices) > 1:
        nbytes = min(a.bytes, 16 << 20) if a.emulate else a.bytes
        out["allreduce"] = allreduce(len(devices), nbytes, not a.emulate, timeout=120 + a.seconds)
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
