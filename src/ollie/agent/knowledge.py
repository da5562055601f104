"""What the model is told besides its agent's prompt: the project's instructions (`AGENTS.md`), the
skills it may read, and the agents it may start as sub-agents. Gathered for a cwd and an agent,
when a session starts, switches agent or changes cwd (`Runtime.say_notices`, in a thread), not at each
request: the system prompt stays the same from one request to the next, as prompt caches want.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import config, project, skills
from ..config import AgentConfig
from ..types import ConfigError


@dataclass(frozen=True, slots=True)
class Knowledge:
    text: str  # appended to the agent's prompt ("" for nothing)
    notices: list[str] = field(default_factory=list)  # for the user: files cut short or left out


def gather(cfg: AgentConfig, cwd: str) -> Knowledge:
    parts: list[str] = []
    notices: list[str] = []
    if cfg.instructions:
        found, said = project.instructions(cwd)
        notices += said
        if found:
            parts.append(_instructions_text(found))
    if cfg.skills:
        offered, said = skills.list_skills(cwd)
        notices += said
        if offered:
            parts.append(_skills_text(offered))
    if cfg.subagents and (text := _subagents_text(cfg.subagents)):
        parts.append(text)
    return Knowledge("\n\n".join(parts), notices)


def _instructions_text(found: list[project.Instructions]) -> str:
    head = (
        "# Instructions for this project\n"
        "From AGENTS.md files: the user's, then the project's from its root down to your working "
        "directory (the nearest last, and first to follow where they disagree)."
    )
    cut = "\n[cut here: the rest of the file was not read]"
    files = [f"## {i.path}\n{i.text.strip()}{cut if i.cut else ''}" for i in found]
    return "\n\n".join([head, *files])


def _skills_text(offered: list[skills.Skill]) -> str:
    lines = [
        "# Skills",
        "A skill holds instructions for one kind of task. When a task matches a skill's description, "
        "read its SKILL.md (cat PATH) before you start, and follow it; the files it names lie beside it.",
    ]
    lines += [f"- {s.name}: {s.description} ({s.path})" for s in offered]
    return "\n".join(lines)


def _subagents_text(names: list[str]) -> str:
    agents = []
    for name in names:
        try:
            description = config.load_agent(name).description
        except ConfigError:
            continue  # starting it would fail the same way, and say why then
        agents.append(f"- {name}: {description}" if description else f"- {name}")
    head = "# Sub-agents\nBesides your own agent, you may start these as sub-agents (subagent_spawn --agent NAME):"
    return "\n".join([head, *agents]) if agents else ""
