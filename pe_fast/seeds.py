"""Every random stream a model trains with, and the seed offset that keeps it apart from the others.

A model's seed s seeds its weights directly (torch.Generator(s)); each other stream adds its own offset, so that
two models with the same seed and a different PE kind, σ or task start from the same weights and draw the same
batches: comparisons across PEs are paired.

DATA_SEED_OFFSET and PE_DROPOUT_SEED_OFFSET hold the same number on purpose, and do not collide: the batch order is
torch.Generator(s + DATA_SEED_OFFSET), while the PE dropout hashes [PE_DROPOUT_SEED_OFFSET, s, step] through numpy's
SeedSequence into a 64-bit seed per step. Giving either a new value would change every result trained with it (the
results in docs/results/ included), so both keep the value their results were trained with. STREAMS lists each
stream with how it is seeded; tests/test_seeds.py checks that no two streams share one.
"""
from __future__ import annotations

PE_SEED_OFFSET = 1_000_003          # the PE's initial table (models/transformer.py)
DATA_SEED_OFFSET = 2_000_003        # the order of the training batches (train.BatchSampler)
PE_DROPOUT_SEED_OFFSET = 2_000_003  # the PE dropout's keep masks, hashed with the seed and step (models/absolute_pe)
MASK_SEED_OFFSET = 3_000_017        # masked-region tasks: the masks of the training batches (tasks/masked_regions)
EVAL_MASK_SEED = 12_345             # masked-region tasks: the one fixed mask per evaluation item, the same for all
NTK_PROJECTION_SEED = 24_680        # the tangent kernel's random projection of an item's outputs (metrics/tangent_kernel)

# stream -> (how it is seeded, its number): two streams of the same kind must not share a number
STREAMS = {
    "weights": ("torch.Generator(seed + offset)", 0),
    "pe": ("torch.Generator(seed + offset)", PE_SEED_OFFSET),
    "batches": ("torch.Generator(seed + offset)", DATA_SEED_OFFSET),
    "training masks": ("torch.Generator(seed + offset)", MASK_SEED_OFFSET),
    "pe dropout": ("SeedSequence([offset, seed, step])", PE_DROPOUT_SEED_OFFSET),
    "evaluation masks": ("torch.Generator(fixed)", EVAL_MASK_SEED),
    "tangent kernel projection": ("torch.Generator(fixed)", NTK_PROJECTION_SEED),
}
