"""The random streams of pe_fast.seeds: apart from each other, and drawn where the modules say."""
import numpy as np
import torch

from pe_fast import seeds
from pe_fast.models.absolute_pe import PEDropout
from pe_fast.train import BatchSampler


def test_no_two_streams_share_a_seed():
    assert len(set(seeds.STREAMS.values())) == len(seeds.STREAMS)


def test_the_batch_order_is_the_data_stream():
    sampler = BatchSampler(num_items=64, batch_size=8, seeds=[7], device=torch.device("cpu"))
    expected = torch.randperm(64, generator=torch.Generator().manual_seed(7 + seeds.DATA_SEED_OFFSET))[:8]
    assert torch.equal(sampler.next()[0], expected)


def test_the_pe_dropout_masks_are_not_the_batch_stream():
    """Equal offsets, different streams: the dropout's generator is seeded with SeedSequence's hash of
    [offset, seed, step], never with seed + offset."""
    seed = 7
    dropout = PEDropout(0.5, [seed], num_blocks=1, device=torch.device("cpu"))
    mask = dropout.masks(0, (1, 4, 64))
    mixed = np.random.SeedSequence([seeds.PE_DROPOUT_SEED_OFFSET, seed, 0]).generate_state(1, np.uint64)[0]
    assert int(mixed) != seed + seeds.DATA_SEED_OFFSET
    expected = torch.empty(1, 1, 4, 64).bernoulli_(0.5, generator=torch.Generator().manual_seed(int(mixed))) / 0.5
    assert torch.equal(mask[:, 0], expected)
