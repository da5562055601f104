"""Plans that persist where the user keeps tasks.

`task_plan` runs sandboxed and writes a plan into the plans directory (pl/ on the mount), which
every session of the user shares. After each tool round the session looks there
(`Plans.after_tools`): its own plans become its `plan`, and their steps are committed to a task
backend as tasks, one per step, with their dependencies; a step checked (`task_complete`), or the
whole plan renamed `__done`, marks its task done. While a plan is `__wip`, its next step (the first
unchecked one) is claimed: its task is set in progress. A plan revised (the file_* tool scripts
sign the session's own plan anew, see below) has its tasks revised with it: a step added is a new
task, a step whose title or description changed has its task edited, a step removed has its task
deleted; a step is followed across a revision by its title, or, where titles changed, by the place
and likeness of its title. A plan removed from pl/ has its tasks deleted. Tasks done are never
deleted: they are what was done.

The backend is, in this order:
- an MCP server (any tool server of the agent) whose tools include `task_create`, which must
  answer a plain-text id; `task_dep` (dependencies), `task_update` (status in progress, done),
  `task_edit` (title, description) and `task_delete` are used when present (each one missing is
  told once, and what it would do is left undone), and a step's dependencies are in its task's
  description either way;
- the `PlanBackend` a program passed to `open_session(plan_backend=...)`;
- none: the plan lives in pl/ and in the session's `plan` only.
It is chosen again whenever the agent's tool servers change (an agent switch).

Which plans are the session's own. pl/ is writable by the code of every session, so a plan file
proves nothing by being there. Each session has a secret key (`plan.key` in its store, which the
sandbox hides), handed to its own stages as $OLLIE_PLAN_KEY. `task_plan` signs what it wrote: an
HMAC over the plan's file stem, the session id, the goal, the steps and their dependencies (not
the check marks), on the plan's second line. A session commits only plans its own key signed: a
plan another session's code wrote, copied or edited is never committed (one that claims this
session is reported). Check marks are not signed, so another session's code can mark steps done;
it cannot create tasks.

Revisions. The agent revises its plan with file_edit and file_write, as the seed has it. Those
scripts, run by the session's own code (which holds the key), sign a plan anew after writing it,
but only when the plan was this session's and its signature verified before the edit: the key
proves that the edit is the session's own code, the old signature that the plan is the session's
and that no other code changed it since. So a revision of the session's own plan stays its plan,
while a plan another session's code wrote or changed stays refused, even once this session's code
edits it too: the key never signs what others wrote. (The session's code could always sign any
plan, with task_plan's code or its own; signing revisions gives it nothing it did not have.) An
edit made another way (sed, an editor) breaks the signature, and the plan stays as it was signed.

What was committed is kept in the session's store (`plan-tasks.json`: per backend and plan, each
step's task id, dependencies linked, done, claimed, the title and description the task was given;
the tasks of removed steps still to delete), written after every call, so a restart or a failure
half-way creates no task twice. A backend that fails leaves the plan as it is: the user sees why
(an info event), and the rest is committed at a later sync. Plan text is the sandbox's: its size
is bounded, and it only ever travels as data (tool arguments, the session's plan).

Plans are an extension of the agent (`ollie.agent.extensions`), which `open_session` installs: the
loop calls `Plans.after_tools` after each tool round, and each tool call's env gets the key
(`Plans.stage_env`). They import nothing of the agent: what they need of their session (its id,
store, plan, events) is handed to them (`PlanSession`).

Where things are: `files` (a plan file: its name, its signature, its bounds, reading pl/),
`backends` (the `PlanBackend` protocol, and an MCP task server as one), `sync` (`Plans`, a
session's side: finding its plans, showing the newest, committing them).
"""

from .backends import MCPTaskBackend, PlanBackend, PlanBackendError, Task
from .files import signature
from .sync import KEY_FILE, KEY_VAR, MAP_FILE, Plans

__all__ = [
    "KEY_FILE",
    "KEY_VAR",
    "MAP_FILE",
    "MCPTaskBackend",
    "PlanBackend",
    "PlanBackendError",
    "Plans",
    "Task",
    "signature",
]
