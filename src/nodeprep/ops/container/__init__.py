"""The container way: every rank runs inside one image on every node (Docker or Podman).

image.py   what `container_image` names: a registry reference (the grammar Docker reads) or
           an archive on the controller (docker save / podman save, OCI archive or layout)
spec.py    a node's container settings as one checked object (image, engine, fetch, mounts, env)
archive.py an image archive read on the controller without an engine: its ID (the config's
           sha256, as every engine shows it), architecture, tags
registry.py  a registry reference pinned on the controller with skopeo (digest, ID, size per
           architecture), copied once into an archive for the relay; the pin each node got
run.py     a job's container on one node as argv: start (host network and IPC, the GPUs, RDMA,
           the job directory, variables by name), exec, remove, leftovers
readiness.py  whether a node can run the image, from its CONTAINER fact: the engine, how, and
           each missing piece with its fix
"""
