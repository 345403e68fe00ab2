"""Accounting of a run or an iteration: calls and tokens per role, parse failures and repairs, skips, the
simulated flag. Meters add up, so an iteration's meter folds into its run's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from combee.llm import ChatResponse, Role, Usage

__all__ = ["Meter", "RoleStats"]


@dataclass
class RoleStats:
    """One role's accounting. An answer that fails to parse is re-asked (up to the attempts allowed):

    ``parse_failures`` counts answers that did not parse (by :attr:`LLMParseError.kind` in ``failure_kinds``),
    ``repairs`` the re-asks that carried the parser's error back to the model, ``repaired`` the calls that
    parsed after at least one failure, ``gave_up`` the calls whose every answer failed. ``salvaged`` counts
    accepted answers from which ``invalid_items`` invalid items (operations, tags, insights, proposal ids)
    were dropped.
    """

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cached: int = 0
    parse_failures: int = 0
    max_prompt_tokens: int = 0
    repairs: int = 0
    repaired: int = 0
    gave_up: int = 0
    salvaged: int = 0
    invalid_items: int = 0
    failure_kinds: dict[str, int] = field(default_factory=dict)

    def absorb(self, other: RoleStats) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_prompt_tokens += other.cached_prompt_tokens
        self.cached += other.cached
        self.parse_failures += other.parse_failures
        self.max_prompt_tokens = max(self.max_prompt_tokens, other.max_prompt_tokens)
        self.repairs += other.repairs
        self.repaired += other.repaired
        self.gave_up += other.gave_up
        self.salvaged += other.salvaged
        self.invalid_items += other.invalid_items
        for kind, n in other.failure_kinds.items():
            self.failure_kinds[kind] = self.failure_kinds.get(kind, 0) + n


@dataclass
class Meter:
    """Accounting of one run or one iteration: calls and tokens per role, failures, simulated flag.

    Meters add up (:meth:`absorb`), so an iteration's meter folds into the run's.
    """

    roles: dict[str, RoleStats] = field(default_factory=dict)
    skipped_traces: int = 0
    skipped_groups: int = 0
    merge_fallbacks: int = 0
    unknown_proposal_ids: int = 0
    # merge answers' combine entries dropped because the same answer kept every proposal they combine
    redundant_combines: int = 0
    folded_proposals: int = 0  # near-duplicate ADD proposals collapsed before merge calls
    folded_ops: int = 0  # ADDs of final deltas folded into existing bullets or into one another
    folded_copies: int = 0  # ADDs folded as copies of one lesson made by the augmented shuffle (dedup.fold_copies)
    dedup_s: float = 0.0  # wall time spent computing vectors and folding (the cost of semantic de-duplication)
    refused: dict[str, int] = field(default_factory=dict)  # insights and ops the lesson screen refused, by reason
    trimmed: dict[str, int] = field(default_factory=dict)  # sentences it took out of lessons it kept, by reason
    quarantined: dict[str, int] = field(default_factory=dict)  # ops the guard held back (combee.guard), by reason
    held: dict[str, int] = field(default_factory=dict)  # ops and tags corroboration held back (combee.corroborate)
    normalised: int = 0  # lesson texts the guard put on one visible line
    sections_mapped: int = 0  # section labels canonicalised onto another section (combee.sections)
    simulated: bool = False
    real: bool = False  # at least one answer came from a server that did not say it is the simulator

    def record(self, role: Role, response: ChatResponse) -> None:
        s = self.roles.setdefault(role.value, RoleStats())
        s.calls += 1
        s.prompt_tokens += response.usage.prompt_tokens
        s.completion_tokens += response.usage.completion_tokens
        s.cached_prompt_tokens += response.usage.cached_prompt_tokens
        s.max_prompt_tokens = max(s.max_prompt_tokens, response.usage.prompt_tokens)
        s.cached += int(response.cached)
        if not response.cached:
            if response.simulated:
                self.simulated = True
            else:
                self.real = True

    def role(self, role: Role) -> RoleStats:
        return self.roles.setdefault(role.value, RoleStats())

    def parse_failure(self, role: Role, kind: str = "invalid") -> None:
        s = self.role(role)
        s.parse_failures += 1
        s.failure_kinds[kind] = s.failure_kinds.get(kind, 0) + 1

    def absorb(self, other: Meter) -> None:
        for role, s in other.roles.items():
            self.roles.setdefault(role, RoleStats()).absorb(s)
        self.skipped_traces += other.skipped_traces
        self.skipped_groups += other.skipped_groups
        self.merge_fallbacks += other.merge_fallbacks
        self.unknown_proposal_ids += other.unknown_proposal_ids
        self.redundant_combines += other.redundant_combines
        self.folded_proposals += other.folded_proposals
        self.folded_ops += other.folded_ops
        self.folded_copies += other.folded_copies
        self.dedup_s += other.dedup_s
        for reason, n in other.refused.items():
            self.refused[reason] = self.refused.get(reason, 0) + n
        for reason, n in other.trimmed.items():
            self.trimmed[reason] = self.trimmed.get(reason, 0) + n
        for reason, n in other.quarantined.items():
            self.quarantined[reason] = self.quarantined.get(reason, 0) + n
        for reason, n in other.held.items():
            self.held[reason] = self.held.get(reason, 0) + n
        self.normalised += other.normalised
        self.sections_mapped += other.sections_mapped
        self.simulated |= other.simulated
        self.real |= other.real

    def refuse(self, reasons: Iterable[str]) -> None:
        """Count lessons the screen refused (:mod:`combee.screen`), one reason each."""
        for reason in reasons:
            self.refused[reason] = self.refused.get(reason, 0) + 1

    def quarantine(self, reasons: Iterable[str]) -> None:
        """Count operations the guard quarantined (:mod:`combee.guard`), one reason each."""
        for reason in reasons:
            self.quarantined[reason] = self.quarantined.get(reason, 0) + 1

    def hold(self, counts: Mapping[str, int]) -> None:
        """Count what corroboration held back (:mod:`combee.corroborate`), by reason."""
        for reason, n in counts.items():
            self.held[reason] = self.held.get(reason, 0) + n

    def trim(self, reasons: Iterable[str]) -> None:
        """Count sentences the screen took out of lessons it kept, one reason each."""
        for reason in reasons:
            self.trimmed[reason] = self.trimmed.get(reason, 0) + 1

    def dedup_counts(self) -> dict[str, int | float]:
        """What the semantic de-duplicator folded, and the wall time it took (a report's ``dedup`` entry)."""
        return {
            "folded_proposals": self.folded_proposals,
            "folded_ops": self.folded_ops,
            "seconds": round(self.dedup_s, 4),
        }

    @property
    def calls(self) -> int:
        return sum(s.calls for s in self.roles.values())

    @property
    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=sum(s.prompt_tokens for s in self.roles.values()),
            completion_tokens=sum(s.completion_tokens for s in self.roles.values()),
            cached_prompt_tokens=sum(s.cached_prompt_tokens for s in self.roles.values()),
        )
