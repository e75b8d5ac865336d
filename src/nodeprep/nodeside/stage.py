"""Runs where a stage's source is (the controller, or the node that holds it): data staging
(ops/stage/), standard library only, any python3 from 3.6 on (no f-strings, no walrus). Its
other end, on each receiving node, is stagerecv.py.

    python3 stage.py scan ROOT CHUNK CACHE   ROOT's files, sizes, mtimes and chunk sums (JSON);
                                             CACHE "-": every file read, none remembered
    python3 stage.py send ROOT REQUEST       the chunks REQUEST names, as a stream on stdout

A file's chunk sums are the sha256 of each CHUNK bytes of it (the last chunk shorter). The
stream: frames of a JSON header's length as 10 digits, the header {"p": path, "s": size, "m":
mtime_ns, "c": chunk size, "hs": [chunk sums], "i": this chunk, "md": mode, "f": 1 to ignore
the node's record}, then the chunk's bytes; ten zeros end it (docs/staging.md)."""

import hashlib
import json
import os
import sys

CTL = ".nodeprep-stage"  # a destination's own directory (stagerecv.py's): never a source file
BLOCK = 1 << 20
END = b"0" * 10


def hash_file(path, chunk, size):
    """The chunk sums of PATH (SIZE bytes)."""
    sums = []
    with open(path, "rb") as fh:
        for _ in range(max(1, -(-size // chunk))):
            h, left = hashlib.sha256(), chunk
            while left:
                piece = fh.read(min(BLOCK, left))
                if not piece:
                    break
                h.update(piece)
                left -= len(piece)
            sums.append(h.hexdigest())
    return sums


def walk(root):
    """(relative path, full path) of every regular file under ROOT (a file: itself)."""
    if os.path.isfile(root):
        yield os.path.basename(root), root
        return
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root) + "/"
        dirs[:] = sorted(x for x in dirs if rel != "./" or x != CTL)
        for f in sorted(files):
            if os.path.isfile(os.path.join(d, f)):
                yield (rel + f)[2 if rel == "./" else 0 :], os.path.join(d, f)


def scan(root, chunk, cache_path):
    """Every file of ROOT with its chunk sums; a file whose size, mtime, inode and ctime are
    those CACHE lists is not read again."""
    if not os.path.exists(root):
        sys.stderr.write("stage: %s: no such file or directory\n" % root)
        return 3
    cache = {} if cache_path == "-" else load_json(cache_path, {})
    files, fresh = [], {}
    for rel, full in walk(root):
        st = os.stat(full)
        key = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, chunk]
        old = cache.get(rel)
        if old and old[:5] == key:
            sums = old[5]
        else:
            try:
                sums = hash_file(full, chunk, st.st_size)
            except OSError as err:
                sys.stderr.write("stage: cannot read %s: %s\n" % (full, err.strerror))
                return 3
        fresh[rel] = key + [sums]
        files.append([rel, st.st_size, st.st_mtime_ns, sums, st.st_mode & 0o7777])
    try:
        if cache_path != "-":
            os.makedirs(os.path.dirname(cache_path), mode=0o700, exist_ok=True)
            put(cache_path, json.dumps(fresh))
    except OSError:
        pass  # a cache that cannot be written costs the next scan's reads only
    json.dump({"files": files}, sys.stdout)
    return 0


def load_json(path, default):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def put(path, text):
    """PATH replaced by TEXT whole (written beside, renamed)."""
    with open(path + ".tmp", "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(text)
    os.rename(path + ".tmp", path)


def send(root, request):
    """The frames REQUEST ([[path, size, mtime, chunk, sums, [chunks], mode, force]...]) names,
    on stdout (force: the node's record of the file is not to be trusted): the bytes as they
    are now, under the sums given (a file changed since is refused where it lands)."""
    wanted = load_json(request, None)
    out = sys.stdout.buffer
    single = os.path.isfile(root)
    for p, size, mtime, chunk, sums, chunks, mode, force in wanted:
        head = {"p": p, "s": size, "m": mtime, "c": chunk, "hs": sums, "md": mode}
        if force:
            head["f"] = 1
        with open(root if single else os.path.join(root, p), "rb") as fh:
            for i in chunks:
                n = max(0, min(chunk, size - i * chunk))
                head["i"] = i
                text = json.dumps(head).encode()
                out.write(b"%010d" % len(text) + text)
                fh.seek(i * chunk)
                left = n
                while left:
                    piece = fh.read(min(BLOCK, left))
                    if not piece:  # shorter than listed: pad, the sum refuses it
                        piece = b"\0" * min(BLOCK, left)
                    out.write(piece)
                    left -= len(piece)
    out.write(END)
    out.flush()
    return 0


def main(a):
    if len(a) == 5 and a[1] == "scan":
        return scan(a[2], int(a[3]), a[4])
    if len(a) == 4 and a[1] == "send":
        return send(a[2], a[3])
    sys.stderr.write("usage: stage.py scan ROOT CHUNK CACHE | send ROOT REQUEST\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
