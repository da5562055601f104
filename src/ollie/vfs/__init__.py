"""A file-system toolkit that knows nothing of agents: a tree of files, served over 9P and FUSE.

`namespace` is the protocol-independent tree (`Dir`, `File`, `Handle`, `Namespace`); `stores`
has the common kinds of file (synthetic text, control files, write-on-close files, directories on
disk); `ninep` is the 9P2000 codec, `ninep_server` and `ninep_client` its two ends; `remote` is a
tree reached over 9P; `fuse` mounts a tree (local or remote) with the kernel's FUSE protocol
(`fuse_kernel`). It imports nothing of ollie but `types` and `config.private_dir`; ollie's own
tree of sessions (`ollie.fs`) is built with it, and the terminal UI speaks 9P with it alone.
"""
