"""What each compiled tier made of a module: which fusions and while loops got a compiled kernel, which run op
by op and why (`hloexec run --profile` prints it).

A computation runs op by op for a named reason only: the generator declined it (`TierUnsupported`), or the
compile policy found it too small to pay for compiling. Any other exception from a generator is a bug: it is
reported with a `CompileWarning` (an error in the test suite) and counted apart, and the computation runs op
by op so that the run still completes.
"""

from __future__ import annotations

import threading
import traceback
import warnings

from ..errors import CompileWarning, TierUnsupported

COMPILED = "compiled"


class TierReport:
    """Per tier ("fusion", "loop"): computation name -> outcome (COMPILED, or why it runs op by op). Shared by the
    plans of one module (ExecContext); a computation prepared twice (plans of inlined calls) counts once."""

    def __init__(self):
        self.outcomes: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def record(self, tier: str, name: str, outcome: str) -> None:
        with self._lock:
            self.outcomes.setdefault(tier, {})[name] = outcome

    def generate(self, tier: str, name: str, generator):
        """`generator()`'s kernel, recorded as compiled; None, with the reason recorded, where it declines or
        fails (a failure is a bug: CompileWarning)."""
        try:
            kernel = generator()
        except TierUnsupported as e:
            self.record(tier, name, e.reason)
            return None
        except Exception as e:  # noqa: BLE001 - any other exception is a generator bug: say so, run op by op
            self.record(tier, name, f"generator error {type(e).__name__}")
            where = traceback.extract_tb(e.__traceback__)[-1]
            warnings.warn(
                f"hloexec's {tier} generator failed on %{name} ({type(e).__name__}: {e}, at "
                f"{where.filename}:{where.lineno}): a bug; it runs op by op",
                CompileWarning,
                stacklevel=3,
            )
            return None
        self.record(tier, name, COMPILED)
        return kernel

    def to_dict(self) -> dict:
        """{tier: {"compiled": n, "op_by_op": n, "reasons": {reason: [computation names]}}}"""
        out = {}
        for tier, outcomes in sorted(self.outcomes.items()):
            reasons: dict[str, list[str]] = {}
            for name, outcome in sorted(outcomes.items()):
                if outcome != COMPILED:
                    reasons.setdefault(outcome, []).append(name)
            compiled = sum(o == COMPILED for o in outcomes.values())
            out[tier] = {
                "compiled": compiled,
                "op_by_op": len(outcomes) - compiled,
                "reasons": dict(sorted(reasons.items(), key=lambda kv: (-len(kv[1]), kv[0]))),
            }
        return out

    def format(self, names_shown: int = 3) -> list[str]:
        """Lines for a terminal: per tier the counts, then each reason with how many and a few names."""
        lines = []
        for tier, summary in self.to_dict().items():
            lines.append(
                f"{tier}s: {summary['compiled']} with a generated kernel (compiled once run enough), "
                f"{summary['op_by_op']} op by op"
            )
            for reason, names in summary["reasons"].items():
                shown = ", ".join(f"%{n}" for n in names[:names_shown]) + (", ..." if len(names) > names_shown else "")
                lines.append(f"  {len(names):5d} x {reason}: {shown}")
        return lines
