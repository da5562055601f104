"""The file server: sessions and ollie's directories as files, built with `ollie.vfs`.

`tree` is the whole tree and `view` a session's own; `sessions` and `session_files` are the
sessions and their files, `jobs` (with `ray_jobs`) batch jobs, `transcripts` the stored chats,
`worktrees` a sub-agent's git worktree; `server` is the serving process behind `ollie srv`.
"""
