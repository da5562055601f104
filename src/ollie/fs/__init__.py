"""The file server: sessions and ollie's directories as files, built with `ollie.vfs`.

`tree` is the whole tree and `view` a session's own; `sessions` and `session_files` are the
sessions and their files, `jobs` and `job_files` the batch jobs and theirs (`job` one job and the
Executor protocol, `local_jobs` and `ray_jobs` its two executors), `transcripts` the stored chats,
`worktrees` a sub-agent's git worktree; `server` is the serving process behind `ollie srv`.
"""
