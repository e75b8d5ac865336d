"""The builtin training payloads (`train --payload NAME`), run by the rank wrapper in the nodes'
venv: health (init, all_reduce, barrier, one line per rank), ddp (a tiny trainer with
snapshot/resume and failure knobs), allreduce (bus bandwidth per message size)."""
