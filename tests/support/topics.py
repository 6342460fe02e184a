"""Two topics of prompts apart in their words (arithmetic, baking): k-means over words must
split them, so a prompt-cluster workflow has a known answer."""

from __future__ import annotations

MATH = [
    f"What is {a} plus {b}? Add the numbers and give the sum of the integers."
    for a, b in zip(range(3, 23), range(40, 60), strict=True)
]
COOKING = [
    f"How long should I bake {food} in the oven at {t} degrees? Any recipe tips for the dough?"
    for food, t in zip(
        ["bread", "cookies", "pizza", "bagels", "scones"] * 4, range(160, 240, 4), strict=True
    )
]
