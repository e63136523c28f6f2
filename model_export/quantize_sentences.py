"""Real-looking English sentences, seeded: int8 calibration without a data set download.

Short news-like statements (some with two clauses) and questions, drawn from
fixed phrase lists: what a sentence-embedding model is served on, not random
token embeddings (whose activations differ from real text's, so choices made
on them do not carry over). Different seeds give disjoint-enough sets to choose
on one and judge on another.
"""

from __future__ import annotations

import numpy as np

# What ``--int8-keep-cosine`` chooses its fp32 layers on (bench.int8 calibrates on the
# same draw and judges on another seed).
KEEP_SENTENCES, KEEP_SEED = 256, 1

_SUBJECTS = (
    "The committee",
    "My neighbour",
    "A young engineer",
    "The old library",
    "Our team",
    "The government",
    "A small startup",
    "The river",
    "Most students",
    "The orchestra",
    "Her grandmother",
    "The city council",
    "A stray cat",
    "The new manager",
    "Scientists",
    "The hospital",
    "This recipe",
    "The train to Berlin",
    "Local farmers",
    "The museum",
    "An anonymous donor",
    "The football club",
    "The software update",
    "Two hikers",
    "The central bank",
    "A famous novelist",
    "The weather service",
    "The school board",
    "The airline",
    "A group of volunteers",
    "The research lab",
    "The restaurant downstairs",
)
_PREDICATES = (
    "postponed its decision",
    "announced a new plan",
    "painted the kitchen walls",
    "won the regional championship",
    "raised interest rates",
    "published a detailed report",
    "closed for renovation",
    "flooded the lower streets",
    "found a cheaper supplier",
    "cancelled the evening concert",
    "planted two hundred trees",
    "fixed the broken bridge",
    "lost the keys again",
    "opened a second branch",
    "tested the vaccine on volunteers",
    "reduced the price of tickets",
    "delayed the launch",
    "reported record profits",
    "hired three new teachers",
    "discovered a rare fossil",
    "improved battery life",
    "moved to a quieter neighbourhood",
    "shared the recipe online",
    "doubled its budget",
    "complained about the noise",
    "translated the book into Spanish",
    "ran out of coffee",
    "signed a contract with the union",
    "sold the old farmhouse",
    "repaired the roof",
)
_TAILS = (
    "after a long meeting",
    "because of the storm",
    "without telling anyone",
    "earlier this week",
    "despite strong objections",
    "to everyone's surprise",
    "for the third time this year",
    "before the holidays",
    "in the middle of the night",
    "according to the newspaper",
    "while the mayor was abroad",
    "on Tuesday morning",
    "as prices kept rising",
    "with help from the neighbours",
    "at the request of parents",
    "",
    "",
    "",
)
_QUESTIONS = (
    "Can you recommend a good restaurant near the station?",
    "How long does it take to learn to play the piano?",
    "Why is the sky blue during the day and red at sunset?",
    "What is the best way to store fresh herbs?",
    "Where did you park the car last night?",
    "Is it safe to swim in the lake after heavy rain?",
    "How do vaccines train the immune system?",
    "Which train goes to the airport on Sundays?",
    "What causes inflation to rise so quickly?",
    "Do you know a cheap hotel in the old town?",
)


def sentences(count: int, seed: int) -> list[str]:
    """``count`` sentences drawn with ``seed``: statements, and now and then a question."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        if rng.random() < 0.1:
            out.append(str(rng.choice(_QUESTIONS)))
            continue
        tail = str(rng.choice(_TAILS))
        text = f"{rng.choice(_SUBJECTS)} {rng.choice(_PREDICATES)}{' ' + tail if tail else ''}."
        if rng.random() < 0.3:  # longer: two clauses
            text = text[:-1] + f", and {str(rng.choice(_SUBJECTS)).lower()} "
            text += f"{rng.choice(_PREDICATES)}."
        out.append(text)
    return out
