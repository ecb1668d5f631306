"""A finished pack's trained models: DIR/packs/<i>/weights.safetensors. It holds the stacked model's state as
StackedTransformer keeps it (every per-model tensor with its model axis first), the task's token coordinates where
the PE needs them, and, as the file's text metadata, what rebuilds the pack without loading the task: the model
configuration, each model's id, seed and σ, and the step the weights were taken at. safetensors holds tensors and
text only, so a file from anyone runs no code; every value read from it is checked before a model is built."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch

from pe_fast.data.declared_size import inflation, stored_bytes
from pe_fast.models import ModelConfig, StackedTransformer
from pe_fast.models.absolute_pe import SINUSOIDAL_PES
from pe_fast.models.relative_pe import RelativePE
from pe_fast.models.transformer import ROTARY_PES
from pe_fast.results import run_folder
from pe_fast.results.settings import MAX_DEPTH, MAX_MLP_WIDTH, MAX_MODELS, MAX_WIDTH

FORMAT = "pe_fast-weights-1"
COORDINATES = "task.coordinates"  # the tensor of the task's token coordinates [N, k], float64, where it has any
MAX_MODEL_IDS = 10**7


class UnreadableWeights(ValueError):
    """A weights file that is missing, truncated, tampered with or of another kind: one line naming it."""


# the keys of pe_fast's metadata, as save_pack_weights writes them
METADATA_KEYS = frozenset({"format", "step", "model_ids", "seeds", "sigmas", "model_config"})


def save_pack_weights(path: Path, model: StackedTransformer, model_ids: list[int], step: int,
                      coordinates: np.ndarray | None):
    """Write the pack's weights to `path` (inside the pack's folder while it is assembled)."""
    from safetensors.torch import save_file
    tensors = {name: value.detach().to("cpu", copy=True).contiguous() for name, value in model.state_dict().items()}
    if coordinates is not None:
        # a copy: the task's coordinates may be a read-only view, which torch warns about on the user's screen
        tensors[COORDINATES] = torch.tensor(np.asarray(coordinates, dtype=np.float64))
    metadata = {"format": FORMAT, "step": step, "model_ids": [int(i) for i in model_ids],
                "seeds": list(model.seeds), "sigmas": list(model.sigmas),
                "model_config": dataclasses.asdict(model.config)}
    save_file(tensors, str(path), metadata={"pe_fast": json.dumps(metadata)})


@dataclasses.dataclass
class PackWeights:
    model: StackedTransformer
    model_ids: list[int]
    step: int


def check_pack_weights(path: Path) -> tuple[dict, ModelConfig]:
    """A weights file's header (its metadata, model configuration and declared tensors) checked without reading a
    tensor, as the report checks every pack's; its metadata (model ids, seeds, σ, step) and model configuration.
    UnreadableWeights names the file and what is wrong."""
    meta, config, _tensors = _read_pack_weights(path, tensors=False)
    return meta, config


def load_pack_weights(path: Path, device: torch.device | str = "cpu") -> PackWeights:
    """The pack a weights file holds, rebuilt and loaded; UnreadableWeights names the file and what is wrong."""
    meta, config, tensors = _read_pack_weights(path, tensors=True)
    refuse = _refuser(path)
    coordinates = tensors.pop(COORDINATES, None)
    if coordinates is not None and not torch.isfinite(coordinates).all():
        refuse(f"its tensor {COORDINATES} holds NaN or Inf: not token coordinates")
    if config.pe == "relative":
        _check_relative_index(config, tensors, coordinates, refuse)
    try:
        model = StackedTransformer(config, meta["seeds"], meta["sigmas"],
                                   None if coordinates is None else coordinates.numpy())
    except (ValueError, TypeError, RuntimeError) as error:  # a PE that needs coordinates
        refuse(f"does not hold a model of its own configuration ({str(error).splitlines()[0][:160]})")
    try:
        model.load_state_dict(tensors, strict=True)  # pe_fast.nn.StackedModule's: names a tensor of another dtype too
    except (ValueError, TypeError, RuntimeError) as error:  # a tensor missing, extra, of a wrong shape or dtype
        refuse(f"does not hold a model of its own configuration ({str(error).splitlines()[0][:160]})")
    return PackWeights(model.to(device).eval(), list(meta["model_ids"]), meta["step"])


def _refuser(path: Path):
    def refuse(what: str):
        raise UnreadableWeights(f"{path}: {what}; not a pe_fast weights file (rerun the sweep to write it again)")
    return refuse


def _read_pack_weights(path: Path, tensors: bool):
    """(metadata, model configuration, the tensors by name or None): the header checked against the configuration
    it declares before any tensor is read."""
    from safetensors import SafetensorError, safe_open
    refuse = _refuser(path)
    if not path.is_file():
        raise UnreadableWeights(f"{path} does not exist")
    if (twice := _key_named_twice(path)) is not None:  # safetensors' and JSON readers keep one of the two
        refuse(f"its header names {twice[:60]!r} twice")
    try:
        with safe_open(str(path), framework="pt") as file:
            header = file.metadata() or {}
            declared = {}
            for name in file.keys():
                view = file.get_slice(name)
                declared[name] = (tuple(view.get_shape()), view.get_dtype())
            meta = _metadata(header, refuse)
            config = _model_config(meta["model_config"], refuse)
            _check_tensors(path, config, len(meta["model_ids"]), declared, refuse)
            read = {name: file.get_tensor(name) for name in declared} if tensors else None
    except SafetensorError as error:
        refuse(f"cannot be read ({str(error)[:120]})")
    except OSError as error:
        raise UnreadableWeights(f"{path} cannot be read ({error.strerror or error})")
    return meta, config, read


# safetensors' own limit on a header's size
MAX_HEADER_BYTES = 100_000_000


def _key_named_twice(path: Path) -> str | None:
    """A key named twice in one object of the file's JSON header (a tensor, or a key of pe_fast's metadata), or
    None; a header safetensors cannot read is left to it to refuse."""
    with open(path, "rb") as file:
        size = int.from_bytes(file.read(8), "little")
        if not 0 < size <= MAX_HEADER_BYTES:
            return None
        text = file.read(size)
    try:
        header = json.loads(text, object_pairs_hook=run_folder.unique_keys)
        metadata = header.get("__metadata__") if isinstance(header, dict) else None
        if isinstance(metadata, dict) and isinstance(metadata.get("pe_fast"), str):
            json.loads(metadata["pe_fast"], object_pairs_hook=run_folder.unique_keys)
    except run_folder.KeyNamedTwice as error:
        return error.key
    except (ValueError, RecursionError):
        return None
    return None


def _metadata(header: dict, refuse) -> dict:
    try:
        meta = json.loads(header["pe_fast"])
    except (KeyError, TypeError, ValueError, RecursionError):  # Python's JSON reader recurses: a crafted nesting
        refuse("its metadata lacks pe_fast's description of the pack")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        refuse(f"its format is not {FORMAT}")
    if (unknown := sorted(set(meta) - METADATA_KEYS)):
        refuse(f"its metadata holds the key {unknown[0][:40]!r}, which pe_fast does not write")
    ids, seeds, sigmas, step = (meta.get(key) for key in ("model_ids", "seeds", "sigmas", "step"))
    if not (isinstance(ids, list) and ids and all(type(i) is int and 0 <= i < MAX_MODEL_IDS for i in ids)
            and len(set(ids)) == len(ids)):
        refuse("its model_ids are not distinct model ids")
    if not (isinstance(seeds, list) and len(seeds) == len(ids) and all(type(s) is int and s >= 0 for s in seeds)):
        refuse("its seeds are not one seed per model")
    if not (isinstance(sigmas, list) and len(sigmas) == len(ids)
            and all(s is None or (type(s) in (int, float) and 0 < s < float("inf")) for s in sigmas)):
        refuse("its sigmas are not one σ (or null) per model")
    if not (type(step) is int and step >= 0):
        refuse("its step is not a count of steps")
    if not isinstance(meta.get("model_config"), dict):
        refuse("it has no model configuration")
    return meta


def _model_config(fields: dict, refuse) -> ModelConfig:
    names = {field.name: field.type for field in dataclasses.fields(ModelConfig)}
    if set(fields) != set(names):
        refuse(f"its model configuration has the fields {sorted(fields)}, not {sorted(names)}")
    for name in ("num_tokens", "token_dim", "out_dim", "width", "depth", "heads", "mlp_width"):
        if not (type(fields[name]) is int and fields[name] >= 1):
            refuse(f"its model configuration's {name} is {fields[name]!r}, not a positive whole number")
    for name, most in (("width", MAX_WIDTH), ("depth", MAX_DEPTH), ("mlp_width", MAX_MLP_WIDTH),
                       ("heads", fields["width"])):
        if fields[name] > most:  # the sweep's own ranges (results/settings.py): a larger one no sweep trained
            refuse(f"its model configuration's {name} is {fields[name]}, more than a sweep allows ({most})")
    if not (fields["readout_token"] is None or type(fields["readout_token"]) is int):
        refuse("its model configuration's readout_token is not a token index")
    try:
        config = ModelConfig(**fields)
    except (TypeError, ValueError) as error:
        refuse(f"its model configuration is refused ({error})")
    if config.readout_token is not None and not 0 <= config.readout_token < config.num_tokens:
        refuse(f"its readout_token {config.readout_token} is not one of its {config.num_tokens} tokens")
    return config


def expected_tensors(config: ModelConfig, models: int, declared: dict[str, tuple]) -> dict[str, tuple]:
    """Every tensor a pack of `models` models of this configuration keeps (StackedTransformer's state_dict), each
    as (shape, safetensors dtype): what a file must hold, exactly, before a model is built from its metadata. The
    one size the configuration does not fix, the relative PE's count of distinct offsets, is the file's (its
    relative.tables.0's last axis), checked against its coordinates' once they are read (_check_relative_index)."""
    M, D, N, F32 = models, config.width, config.num_tokens, "F32"
    expected = {"embed.weight": ((M, config.token_dim, D), F32), "embed.bias": ((M, D), F32),
                "head.weight": ((M, D, config.out_dim), F32), "head.bias": ((M, config.out_dim), F32)}
    for block in range(config.depth):
        prefix = f"blocks.{block}."
        expected.update({prefix + "attention.w_qkv": ((M, D, 3 * D), F32),
                         prefix + "attention.b_qkv": ((M, 3 * D), F32),
                         prefix + "attention.out.weight": ((M, D, D), F32),
                         prefix + "attention.out.bias": ((M, D), F32),
                         prefix + "mlp_in.weight": ((M, D, config.mlp_width), F32),
                         prefix + "mlp_in.bias": ((M, config.mlp_width), F32),
                         prefix + "mlp_out.weight": ((M, config.mlp_width, D), F32),
                         prefix + "mlp_out.bias": ((M, D), F32)})
        for norm in ("norm_attn", "norm_mlp"):
            expected.update({f"{prefix}{norm}.weight": ((M, D), F32), f"{prefix}{norm}.bias": ((M, D), F32)})
    pe_blocks = config.depth if config.pe_at == "every" else 1
    if config.pe == "learned":
        expected.update({f"absolute.tables.{block}": ((M, N, D), F32) for block in range(pe_blocks)})
    elif config.pe == "random":
        expected.update({f"absolute.table{block}": ((M, N, D), F32) for block in range(pe_blocks)})
    elif config.pe in SINUSOIDAL_PES:
        expected["absolute.fixed"] = ((M, N, D), F32)
    elif config.pe in ROTARY_PES:
        half = (config.width // config.heads) // 2
        expected.update({"rotary.cos": ((N, half), F32), "rotary.sin": ((N, half), F32)})
    elif config.pe == "relative":
        offsets = declared.get("relative.tables.0", ((),))[0][-1:] or (1,)
        expected["relative.index"] = ((N, N), "I64")
        expected.update({f"relative.tables.{block}": ((M, config.heads, *offsets), F32)
                         for block in range(pe_blocks)})
    return expected


def _check_tensors(path: Path, config: ModelConfig, models: int, declared: dict[str, tuple], refuse):
    """The file's tensors (name -> (shape, dtype) as its header declares them) are exactly those its configuration
    implies, of its shapes and dtypes, before any tensor is read or any model built: a tampered configuration
    cannot ask for more memory than the file holds (its num_tokens is the size of the PE's tensors and of its
    coordinates), and what the rebuild allocates beside them stays within the file's size on disk."""
    if not 1 <= models <= MAX_MODELS:
        refuse(f"it holds {models} models, more than a sweep trains ({MAX_MODELS})")
    expected = expected_tensors(config, models, declared)
    for name, (shape, dtype) in expected.items():
        if name not in declared:
            refuse(f"it lacks the tensor {name} its configuration (pe {config.pe!r}) implies")
        if declared[name] != (shape, dtype):
            refuse(f"its tensor {name} is {declared[name][1]} {list(declared[name][0])}, its configuration's "
                   f"{dtype} {list(shape)}")
    extra = sorted(set(declared) - set(expected) - {COORDINATES})
    if extra:
        refuse(f"it holds the tensor {extra[0]}, which its configuration (pe {config.pe!r}) has no place for")
    axes = 0
    if COORDINATES in declared:
        shape, dtype = declared[COORDINATES]
        if dtype != "F64" or len(shape) != 2 or shape[0] != config.num_tokens or shape[1] < 1:
            refuse(f"its tensor {COORDINATES} is {dtype} {list(shape)}, not F64 coordinates of its "
                   f"{config.num_tokens} tokens")
        axes = shape[1]
    elif config.pe in ("sin2d", "sinnd", "rope2d"):
        refuse(f"its PE {config.pe!r} needs the tasks' token coordinates ({COORDINATES}), and it holds none")
    if config.pe == "relative" and not 1 <= expected["relative.tables.0"][0][-1] <= config.num_tokens ** 2:
        refuse(f"its relative PE has {expected['relative.tables.0'][0][-1]} offsets, not one per offset between "
               f"its {config.num_tokens} tokens")
    # the tensors read, the model built beside them; the relative PE's offsets computed from the coordinates
    # (an [N, N, axes] array, sorted to find the distinct ones: a few copies of it)
    sizes = {"F32": 4, "F64": 8, "I64": 8}
    held = sum(math.prod(shape) * sizes[dtype] for shape, dtype in declared.values())
    scratch = 4 * 8 * config.num_tokens ** 2 * max(axes, 1) if config.pe == "relative" else 0
    problem = inflation(path, 2 * held + scratch, stored_bytes(path), "a pe_fast weights file")
    if problem is not None:
        raise UnreadableWeights(problem)


def _check_relative_index(config: ModelConfig, tensors: dict, coordinates, refuse):
    """The relative PE's offsets, computed from the file's coordinates as the model does (with no model's tables
    allocated), are the file's relative.index and as many as its tables hold: the tables are never shorter than
    the index they are read through."""
    pe = RelativePE(0, 1, 1, config.num_tokens, None if coordinates is None else coordinates.numpy())
    count = pe.tables[0].shape[-1]
    if tensors["relative.tables.0"].shape[-1] != count or not torch.equal(pe.index, tensors["relative.index"]):
        refuse(f"its relative PE's offsets are not those of its {config.num_tokens} tokens' coordinates")
