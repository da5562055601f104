"""The file server: sessions and ollie's directories as files, over FUSE and 9P.

`namespace` is the protocol-independent tree; `stores` fills it; `fuse` and `ninep_server` serve
it; `server` is the serving process behind `ollie srv`.
"""
