"""The Invoke runners every nodeprep command runs under (Fabric's Remote for ssh, Invoke's
Local for `connection: local`), minus two costs of the stock ones that grow with a command's
output, and one defect:

- Runner.respond joins ALL the output read so far on every chunk, for watchers (pattern ->
  stdin responders) nodeprep never uses: quadratic in the output. The Slurm head's step
  answer for 128 nodes is ~4.5 MB, which made it ~10 GB of string copies and page faults
  (seconds of controller CPU). Here it only runs when there are watchers.
- Output is read 1,000 bytes at a time (a Python loop turn each); here 64 KiB, what is
  there up to that.
- Each chunk was decoded on its own, so a UTF-8 character split across two reads came out
  as two U+FFFD: here one incremental decoder per stream keeps it whole.
"""

from __future__ import annotations

import codecs

from fabric.runners import Remote as _Remote
from invoke.runners import Local as _Local

CHUNK = 64 * 1024


class _Lean:
    read_chunk_size = CHUNK

    def respond(self, buffer_) -> None:
        if self.watchers:
            super().respond(buffer_)

    def read_proc_output(self, reader):
        decoder = codecs.getincrementaldecoder(self.encoding)("replace")
        while True:
            data = reader(self.read_chunk_size)
            if not data:
                break
            text = decoder.decode(data)
            if text:
                yield text
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail


class Remote(_Lean, _Remote):
    pass


class Local(_Lean, _Local):
    pass


RUNNERS = {"remote": Remote, "local": Local}
