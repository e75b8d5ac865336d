"""Runs ON each node a stage fills (ops/stage/): the receiving end of stage.py's stream and
what the destination holds; standard library only, any python3 from 3.6 on.

    python3 stagerecv.py state DEST              DEST's staged files and interrupted ones (JSON)
    python3 stagerecv.py recv DEST LABEL [NEXT]  the stream on stdin into DEST (and on to NEXT)

recv writes each chunk at its place in a part file under DEST/.nodeprep-stage/parts, checking
it against its sha256 as it writes; a chunk that matches is journalled, one that does not is
named and not kept. A file whose chunks are all there gets its mtime, is renamed into place,
and is recorded (DEST/.nodeprep-stage/record, with its inode and ctime, which no write leaves as
they were). Verified chunks survive an interruption; what a node already holds is passed on,
not written again. With NEXT (a fifo), every byte read is also written there as it arrives:
the next node of a chain. Progress: `@@stage LABEL BYTES` lines on stderr (docs/staging.md).

state lists the record's entries whose file is still as recorded (size, inode, ctime), the
parts with their verified chunks, and the free bytes where DEST is or would be."""

import hashlib
import json
import os
import sys
import time

CTL = ".nodeprep-stage"
BLOCK = 1 << 20
END = b"0" * 10


def digest(sums):
    return hashlib.sha256("".join(sums).encode()).hexdigest()


def safe(path):
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[0] == CTL:
        raise ValueError("refusing the path %r" % path)
    return path


def record_path(dest):
    return os.path.join(dest, CTL, "record")


def read_record(dest):
    """{path: entry} of DEST's record, the last line for a path winning (a torn line skipped)."""
    out = {}
    for line in lines(record_path(dest)):
        try:
            e = json.loads(line)
            out[e["p"]] = e
        except (ValueError, KeyError, TypeError):
            continue
    return out


def lines(path):
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            return fh.read().splitlines()
    except OSError:
        return []


def write_record(dest, record):
    put(
        record_path(dest),
        "".join(json.dumps(record[p], sort_keys=True) + "\n" for p in sorted(record)),
    )


def put(path, text):
    """PATH replaced by TEXT whole (written beside, renamed)."""
    with open(path + ".tmp", "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(text)
    os.rename(path + ".tmp", path)


def as_recorded(full, e):
    try:
        st = os.stat(full)
    except OSError:
        return False
    return [st.st_size, st.st_ino, st.st_ctime_ns] == [e["s"], e["ino"], e["ct"]]


def free_bytes(dest):
    p = dest
    while not os.path.isdir(p) and p not in ("/", ""):
        p = os.path.dirname(p)
    st = os.statvfs(p or "/")
    return st.f_bavail * st.f_frsize


def state(dest):
    record, out, parts = read_record(dest), {}, {}
    for p, e in sorted(record.items()):
        if as_recorded(os.path.join(dest, p), e):
            out[p] = [e["s"], e["m"], digest(e["hs"])]
    pdir = os.path.join(dest, CTL, "parts")
    for name in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []:
        if name.endswith(".j"):
            j = read_journal(os.path.join(pdir, name))
            if j is not None:
                parts[j[0]["p"]] = [j[0]["d"], j[0]["s"], sorted(j[1])]
    json.dump(
        {"record": out, "parts": parts, "free": free_bytes(dest), "id": ident(dest)}, sys.stdout
    )
    return 0


def ident(dest):
    """DEST's identity, the same from every node that sees the same directory (an NFS home):
    a random name made once in its control directory; None where it cannot be made."""
    path = os.path.join(dest, CTL, "id")
    if not os.path.exists(path):
        mine = hashlib.sha256(os.urandom(32)).hexdigest()
        try:  # written whole beside, then linked: the first node's name wins, never half of one
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            put(path + "." + mine, mine)
            try:
                os.link(path + "." + mine, path)
            except FileExistsError:
                pass
            os.unlink(path + "." + mine)
        except OSError:
            return None
    return (lines(path) or [None])[0]


def read_journal(path):
    """(its head, {chunk: sum}) of a part's journal; None when unreadable."""
    text = lines(path)
    try:
        pairs = [ln.partition(" ")[::2] for ln in text[1:]]
        return json.loads(text[0]), {int(i): h for i, h in pairs if i.isdigit() and len(h) == 64}
    except (IndexError, ValueError):
        return None


class Receiver:
    """recv's state: the stream parsed from pieces of stdin, chunks written where they go."""

    def __init__(self, dest, label):
        os.umask(0o022)  # the data as readable as the source's modes say (the hop sets 077)
        self.dest, self.label, self.pdir = dest, label, os.path.join(dest, CTL, "parts")
        os.makedirs(self.pdir, mode=0o700, exist_ok=True)
        self.record = read_record(dest)
        self.errors, self.files, self.journals = [], 0, {}

    def frame(self, head, data_len, read):
        """One frame whose bytes READ(n) gives; the frame's chunk verified and kept. A frame
        marked "f" (the controller's --verify found the node's copy bad) ignores the record."""
        p, i, sums = head["p"], head["i"], head["hs"]
        try:
            safe(p)
            key = hashlib.sha1(p.encode("utf-8", "surrogateescape")).hexdigest()
            jpath = os.path.join(self.pdir, key + ".j")
            d = digest(sums)
            had = None if head.get("f") else self.record.get(p)
            if had and digest(had["hs"]) == d and as_recorded(os.path.join(self.dest, p), had):
                return drain(read, data_len)  # staged already (another node of the chain lacked it)
            j = self.journal(jpath, p, head["s"], d)
            if j[1].get(i) == sums[i]:
                drain(read, data_len)  # verified before: passed on only
                return self.complete(head, key, jpath, j)
            fd = os.open(jpath[:-2], os.O_RDWR | os.O_CREAT, 0o600)
        except (OSError, ValueError) as e:
            drain(read, data_len)
            return self.error("%s: %s" % (p, getattr(e, "strerror", None) or e))
        failed = self.write(fd, read, i * head["c"], data_len, sums[i])
        if failed:
            return self.error("%s: chunk %d %s; not kept" % (p, i, failed))
        try:
            with open(jpath, "a", encoding="utf-8") as fh:
                fh.write("%d %s\n" % (i, sums[i]))
        except OSError as e:
            return self.error("%s: cannot journal chunk %d: %s" % (p, i, e.strerror))
        j[1][i] = sums[i]
        self.complete(head, key, jpath, j)

    @staticmethod
    def write(fd, read, at, left, want):
        """The chunk's LEFT bytes from READ at AT in FD, synced; why it is not kept, or None."""
        h, failed = hashlib.sha256(), None
        try:
            while left:
                piece = read(min(BLOCK, left))
                left -= len(piece)
                h.update(piece)
                while piece and failed is None:
                    try:
                        n = os.pwrite(fd, piece, at)
                        piece, at = piece[n:], at + n
                    except OSError as e:
                        failed = "cannot write it: %s" % e.strerror
                at += len(piece)
            if failed is None:
                os.fsync(fd)  # journalled below: on the disk first
        except OSError as e:
            failed = failed or "cannot write it: %s" % e.strerror
        finally:
            os.close(fd)
        if failed is None and h.hexdigest() != want:
            failed = "does not match its checksum"
        return failed

    def complete(self, head, key, jpath, j):
        sums = head["hs"]
        if len(j[1]) == len(sums) and all(j[1].get(k) == s for k, s in enumerate(sums)):
            self.finish(head, key, jpath)

    def journal(self, jpath, p, size, d):
        j = self.journals.get(jpath) or read_journal(jpath)
        if j is None or j[0].get("d") != d or j[0].get("s") != size:
            for f in (jpath, jpath[:-2]):  # another version of the file: start it again
                if os.path.exists(f):
                    os.unlink(f)
            j = ({"p": p, "s": size, "d": d}, {})
            put(jpath, json.dumps(j[0]) + "\n")
        self.journals[jpath] = j
        return j

    def finish(self, head, key, jpath):
        """The part with every chunk verified: its mode and mtime, renamed into place,
        recorded, then its journal gone (a kill between leaves it recorded, not resent)."""
        p, part = head["p"], os.path.join(self.pdir, key)
        full = os.path.join(self.dest, p)
        try:
            if head["s"] == 0 and not os.path.exists(part):
                open(part, "wb").close()  # an empty file has no chunk written
            os.truncate(part, head["s"])
            os.chmod(part, head.get("md", 0o644) & 0o7777)
            os.utime(part, ns=(head["m"], head["m"]))
            os.makedirs(os.path.dirname(full), exist_ok=True)
            os.rename(part, full)
            st = os.stat(full)
            e = {"p": p, "s": head["s"], "m": head["m"], "c": head["c"], "hs": head["hs"]}
            e.update(ino=st.st_ino, ct=st.st_ctime_ns)
            with open(
                record_path(self.dest), "a", encoding="utf-8", errors="surrogateescape"
            ) as fh:
                fh.write(json.dumps(e, sort_keys=True) + "\n")
            self.record[p] = e
            os.unlink(jpath)
        except OSError as e:
            return self.error("%s: cannot put it in place: %s" % (p, e.strerror))
        self.journals.pop(jpath, None)
        self.files += 1

    def error(self, text):
        if len(self.errors) < 20:
            self.errors.append(text)


def drain(read, n):
    while n:
        n -= len(read(min(BLOCK, n)))


class Stdin:
    """stdin read in large pieces, every byte also written to NEXT (a fifo) as it is read;
    progress on stderr at most twice a second."""

    def __init__(self, nxt, label):
        self.out = os.open(nxt, os.O_WRONLY) if nxt else -1
        self.buf, self.label, self.nbytes, self.said = b"", label, 0, 0.0

    def read(self, n):
        """Up to N bytes (all N unless the stream ends); b"" at its end."""
        while len(self.buf) < n:
            got = os.read(0, max(BLOCK, n - len(self.buf)))
            if not got:
                break
            self.forward(got)
            self.buf += got
        out, self.buf = self.buf[:n], self.buf[n:]
        self.nbytes += len(out)
        if time.time() - self.said > 0.5:
            self.said = time.time()
            sys.stderr.write("@@stage %s %d\n" % (self.label, self.nbytes))
            sys.stderr.flush()
        return out

    def exactly(self, n):
        out = self.read(n)
        if len(out) < n:
            raise EOFError("the stream ended early (interrupted): the next run resumes")
        return out

    def forward(self, data):
        try:
            while data and self.out >= 0:
                data = data[os.write(self.out, data) :]
        except OSError:  # the next node stopped reading: this one goes on
            self.close()
        return self.out >= 0

    def close(self):
        if self.out >= 0:
            os.close(self.out)
        self.out = -1

    def rest(self):
        """Pass on whatever follows (nothing, in a well-formed stream), then close NEXT."""
        got = b"x"
        while got and self.out >= 0:
            got = os.read(0, BLOCK)
            self.forward(got)
        self.close()


def recv(dest, label, nxt):
    src = Stdin(nxt, label)
    try:
        rx = Receiver(dest, label)
    except OSError as e:
        src.rest()
        sys.stderr.write("stage %s: cannot make %s: %s\n" % (label, dest, e.strerror))
        return 1
    ended = False
    try:
        while True:
            n = src.exactly(10)
            if n == END:
                ended = True
                break
            head = json.loads(src.exactly(int(n)).decode("utf-8", "surrogateescape"))
            size = max(0, min(head["c"], head["s"] - head["i"] * head["c"]))
            rx.frame(head, size, src.exactly)
    except (EOFError, ValueError, KeyError) as e:
        rx.error(str(e) if isinstance(e, EOFError) else "not a stage stream: %s" % e)
    except OSError as e:  # this node cannot go on: the next ones still get the stream
        rx.error("stopped storing: %s" % e)
    finally:
        src.rest()
    try:
        write_record(dest, rx.record)
    except OSError as e:
        rx.error("cannot compact the record: %s" % e.strerror)
    sys.stderr.write("@@staged %s %d %d\n" % (label, rx.files, src.nbytes))
    for text in rx.errors:
        sys.stderr.write("stage %s: %s\n" % (label, text))
    return 0 if ended and not rx.errors else 1


def main(a):
    if len(a) == 3 and a[1] == "state":
        return state(a[2])
    if len(a) in (4, 5) and a[1] == "recv":
        return recv(a[2], a[3], a[4] if len(a) == 5 else None)
    sys.stderr.write("usage: stagerecv.py state DEST | recv DEST LABEL [NEXT]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
