"""The relay hop as one program (ops/pystack/relay.py runs it on a node as `python3 -I -S -c TEXT
STAGE [NEXT]`, with the stream on stdin): it passes every byte it reads on to NEXT (a fifo into the
ssh to the next node) as it arrives, stores the tar stream's files in STAGE, hashes each file while
it writes it, and leaves STAGE/.sha256 ("SHA NAME" per complete file) for the arrival check, which
then need not read the files back.

Why not `tee | tar -x` (the fallback where a node has no python3): tee copies each byte three
times in 8 KiB pieces, tar twice more, and the arrival check reads every file again to hash
it. Here each byte is read once, written once to the next node and once to its file, in
pieces of up to 1 MiB, and hashed from memory. On the lab that is about a third of a hop's CPU.

What it accepts: regular files with plain names (no slash, not starting with a dot), GNU long
names, pax headers, ustar prefixes; sizes in octal or base-256. Anything else stops the
storing (the forwarding goes on) and the exit status is 1 with a one-line reason; what was
stored completely is still listed, a file cut short is removed.

This text is sent as the argument of `python3 -c`: it holds no single quote and runs on any
python3 from 3.6 on (no f-strings, no walrus), with no module beyond the standard library."""

import hashlib
import os
import sys

BLOCK = 512
CHUNK = 1 << 20
SUMS = ".sha256"


def number(field):
    """A tar number field: octal text, or base-256 (the first byte 0x80)."""
    if field[:1] == b"\x80":
        n = 0
        for b in field[1:]:
            n = n * 256 + b
        return n
    text = bytes(field).split(b"\0")[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ValueError("not a tar stream (a header holds a number that is not one)")


def write_all(fd, data):
    while len(data):
        data = data[os.write(fd, data) :]


class Untar:
    """The tar parser, fed the stream piece by piece; files go straight into STAGE."""

    def __init__(self, stage):
        self.stage = stage
        self.mode = "head"
        self.head = bytearray()
        self.meta = bytearray()
        self.kind = b""
        self.left = 0
        self.pad = 0
        self.fd = -1
        self.sha = None
        self.name = ""
        self.long = None
        self.pax = {}
        self.sums = []
        self.done = False
        self.error = None

    def feed(self, mv):
        i, n = 0, len(mv)
        while i < n and not self.done:
            if self.mode == "head":
                take = min(BLOCK - len(self.head), n - i)
                self.head += mv[i : i + take]
                i += take
                if len(self.head) == BLOCK:
                    h, self.head = bytes(self.head), bytearray()
                    self.header(h)
            elif self.mode == "pad":
                take = min(self.pad, n - i)
                self.pad -= take
                i += take
                if not self.pad:
                    self.mode = "head"
            else:
                take = min(self.left, n - i)
                part = mv[i : i + take]
                if self.mode == "data":
                    write_all(self.fd, part)
                    self.sha.update(part)
                else:
                    self.meta += part
                self.left -= take
                i += take
                if not self.left:
                    self.end_member()

    def header(self, h):
        if not any(h):
            self.done = True  # the end of the archive: the rest is padding
            return
        if number(h[148:156]) != sum(h[:148]) + 256 + sum(h[156:]):
            raise ValueError("not a tar stream (a header fails its checksum)")
        size = number(h[124:136])
        kind = h[156:157]
        if kind in (b"L", b"x", b"g"):
            self.kind, self.meta = kind, bytearray()
            self.begin("meta", size)
            return
        if kind not in (b"0", b"\0", b"7"):
            raise ValueError("unexpected tar member of type %r" % kind)
        name = h[0:100].split(b"\0")[0]
        if h[257:263] == b"ustar\0" and h[345] != 0:
            name = h[345:500].split(b"\0")[0] + b"/" + name
        if self.long is not None:
            name = self.long
        name = self.pax.get(b"path", name)
        try:
            size = int(self.pax.get(b"size", size))
        except ValueError:
            raise ValueError("not a tar stream (a pax size that is not a number)")
        self.long, self.pax = None, {}
        text = name.decode("utf-8", "surrogateescape")
        if not text or text.startswith(".") or "/" in text or "\n" in text or "\0" in text:
            raise ValueError("refused a tar member named %r (wheels only)" % text)
        self.name = text
        self.fd = os.open(
            os.path.join(self.stage, text),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
            0o600,
        )
        self.sha = hashlib.sha256()
        self.begin("data", size)

    def begin(self, mode, size):
        self.mode = mode
        self.left = size
        self.pad = -size % BLOCK
        if not size:
            self.end_member()

    def end_member(self):
        if self.mode == "data":
            os.close(self.fd)
            self.fd = -1
            self.sums.append((self.sha.hexdigest(), self.name))
        elif self.kind == b"L":
            self.long = bytes(self.meta).rstrip(b"\0")
        elif self.kind == b"x":
            self.pax = pax(bytes(self.meta))
        self.mode = "pad" if self.pad else "head"

    def stop(self, why):
        """Storing ends here (WHY, or None at the end of the stream): a file cut short goes."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            try:
                os.unlink(os.path.join(self.stage, self.name))
            except OSError:
                pass
            why = why or "the stream ended inside %s" % self.name
        if why is None and not self.done:
            why = "the stream ended before the end of the archive"
        self.error = self.error or why

    def write_sums(self):
        tmp = os.path.join(self.stage, SUMS + ".tmp")
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
            for sha, name in self.sums:
                f.write(sha + " " + name + "\n")
        os.rename(tmp, os.path.join(self.stage, SUMS))


def pax(data):
    """A pax header block: records "LEN KEY=VALUE\\n"."""
    out, pos = {}, 0
    while pos < len(data):
        sp = data.find(b" ", pos)
        if sp < 0:
            break
        try:
            length = int(data[pos:sp])
        except ValueError:
            length = 0
        if length <= sp - pos:
            raise ValueError("not a tar stream (a pax header is malformed)")
        key, _, value = data[sp + 1 : pos + length - 1].partition(b"=")
        out[key] = value
        pos += length
    return out


def grow_pipe(fd):
    """A pipe of 1 MiB where Linux allows it: fewer, larger reads and writes."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), CHUNK)
    except (OSError, ImportError, ValueError):
        pass


def main(argv):
    stage = argv[1]
    out = os.open(argv[2], os.O_WRONLY) if len(argv) > 2 else -1
    if out >= 0:
        grow_pipe(out)
    grow_pipe(0)
    untar = Untar(stage)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        n = os.readv(0, [buf])
        if not n:
            break
        piece = view[:n]
        if out >= 0:
            try:
                write_all(out, piece)
            except OSError:  # the next node stopped reading: this one goes on
                os.close(out)
                out = -1
        if untar.error is None:
            try:
                untar.feed(piece)
            except (OSError, ValueError) as e:
                untar.stop(str(e))
    if out >= 0:
        os.close(out)
    if untar.error is None:
        untar.stop(None)
    untar.write_sums()
    if untar.error:
        sys.stderr.write("relay: %s\n" % untar.error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
