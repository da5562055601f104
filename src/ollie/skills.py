"""Skills, as other agents offer them: `<skills dir>/<name>/SKILL.md`, whose YAML front matter gives
a `name` and a `description`. The model is offered each skill's name and description; it reads a
skill's body (and the files beside it) with execute_code when a task calls for it.

Where they come from, the first of a name winning: the directories of OLLIE_SKILLS_PATH (the user's;
by default `$OLLIE_CFG_PATH/skills`, which the sandbox reads but cannot write), then the project's
`.ollie/skills/` and `.claude/skills/`, from the cwd up to the repository's root. A project's skill
never hides a user's of the same name: sandboxed code can write the project.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import config, paths
from .project import project_dirs, read_text

PROJECT_DIRS = (".ollie/skills", ".claude/skills")
HEAD_MAX = 16 * 1024  # bytes of a SKILL.md read for its front matter
DESCRIPTION_MAX = 1024  # characters of a description offered to the model, as Anthropic bounds it
SKILLS_MAX = 100  # skills offered
ENTRIES_MAX = 1000  # entries of a skills directory looked at
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True, slots=True)
class Skill:
    name: str
    description: str
    path: Path  # its SKILL.md
    project: bool  # found in the project (which sandboxed code may write), not OLLIE_SKILLS_PATH


def skill_dirs(cwd: str | None) -> list[tuple[Path, bool]]:
    """The directories skills are looked for in, in order, each with whether it is the project's."""
    dirs = [(p, False) for p in config.skills_path()]
    if cwd is not None:
        dirs += [(Path(d, sub), True) for d in reversed(project_dirs(cwd)) for sub in PROJECT_DIRS]
    return dirs


def list_skills(cwd: str | None = None) -> tuple[list[Skill], list[str]]:
    """Every skill once, sorted by name (the user's, and with `cwd` the project's), and notices for
    the user about the SKILL.md files that were left out and why. Not on the event loop
    (`project.read_text`)."""
    found: dict[str, Skill] = {}
    notices: list[str] = []
    for root, in_project in skill_dirs(cwd):
        try:
            names = sorted(_listing(root) if in_project else os.listdir(root))
        except OSError:
            continue
        if len(names) > ENTRIES_MAX:  # (code can fill a project's: each one is a file to read)
            notices.append(f"skills: {root} holds {len(names)} entries; only the first {ENTRIES_MAX} are looked at")
            names = names[:ENTRIES_MAX]
        for dirname in names:
            if dirname.startswith("."):
                continue
            try:
                skill = _read(root, dirname, in_project)
            except ValueError as e:
                notices.append(f"skill {root / dirname / 'SKILL.md'} left out: {e}")
                continue
            if skill is not None and skill.name not in found:
                found[skill.name] = skill
    skills = sorted(found.values(), key=lambda s: s.name)
    if len(skills) > SKILLS_MAX:
        notices.append(f"skills: {len(skills)} found; the model is offered the first {SKILLS_MAX} by name")
    return skills[:SKILLS_MAX], notices


def _listing(root: Path) -> list[str]:
    """A project's skills directory's names, the directory reached through no symlink, once, by
    descriptor: a planted `.claude -> ~/.config/ollie` (or one swapped in after a look) would have
    its listing name what ollie hides, in notices the session's chat shows."""
    fd = paths.open_real_dir(str(root))
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _read(root: Path, dirname: str, in_project: bool) -> Skill | None:
    """The skill in `root/dirname`, None if it has no SKILL.md; ValueError says what is wrong."""
    try:
        got = read_text(str(root / dirname), "SKILL.md", HEAD_MAX, trusted=not in_project)
    except OSError as e:
        raise ValueError(e.strerror or str(e)) from None
    if got is None:
        return None
    meta = front_matter(got[0])
    name = meta.get("name", dirname)
    description = meta.get("description")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"its name {name!r} is not one: use letters, digits, '.', '_' and '-' (64 at most)")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("its front matter has no description: the model would not know when to use it")
    description = " ".join(description.split())
    if len(description) > DESCRIPTION_MAX:
        description = description[: DESCRIPTION_MAX - 1] + "…"
    return Skill(name, description, root / dirname / "SKILL.md", in_project)


def front_matter(text: str) -> dict[str, object]:
    """The YAML mapping between a leading `---` line and the next one; ValueError if it is no
    mapping or no YAML; {} if the text has none."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    try:
        end = next(i for i, line in enumerate(lines[1:], 1) if line.strip() == "---")
    except StopIteration:
        raise ValueError("its front matter has no closing '---' line") from None
    import yaml  # only when a skill has front matter: 14 ms to import

    try:
        meta = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as e:
        raise ValueError(f"its front matter is not YAML: {str(e).splitlines()[0]}") from None
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise ValueError("its front matter is not a mapping of fields")
    return meta


def index(skills: list[Skill]) -> str:
    """sk/idx, and the /skills command: `## name`, `description: …`, `path: …` per skill."""
    return "".join(f"## {s.name}\ndescription: {s.description}\npath: {s.path}\n\n" for s in skills)
