"""The reply's status-line item for speculative decoding (issue 38): how many tokens each pass of
the model wrote and how many drafted tokens it kept, from the reply's GenerationStats."""
from __future__ import annotations


def speculation_note(stats) -> str:
    """'spec 2.3 tok/step, 61 % accepted' for a reply that drafted tokens; '' otherwise.

    A pass of the model (the prompt's, then each verification) writes one token of its own plus
    the drafts it accepted, so the passes are generated - accepted and the tokens a step
    generated / (generated - accepted)."""
    drafted = getattr(stats, "drafted_tokens", 0) or 0
    accepted = getattr(stats, "accepted_tokens", 0) or 0
    generated = getattr(stats, "generated_tokens", 0) or 0
    if drafted <= 0 or generated <= accepted:
        return ""
    per_step = generated / (generated - accepted)
    return f"spec {per_step:.1f} tok/step, {100 * accepted / drafted:.0f} % accepted"
