"""A finished pack's trained models: DIR/packs/<i>/weights.safetensors. It holds the stacked model's state as
StackedTransformer keeps it (every per-model tensor with its model axis first), the task's token coordinates where
the PE needs them, and, as the file's text metadata, what rebuilds the pack without loading the task: the model
configuration, each model's id, seed and σ, and the step the weights were taken at. safetensors holds tensors and
text only, so a file from anyone runs no code; every value read from it is checked before a model is built."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from pe_fast.models import ModelConfig, StackedTransformer

FORMAT = "pe_fast-weights-1"
COORDINATES = "task.coordinates"  # the tensor of the task's token coordinates [N, k], float64, where it has any
MAX_MODEL_IDS = 10**7


class UnreadableWeights(ValueError):
    """A weights file that is missing, truncated, tampered with or of another kind: one line naming it."""


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


def load_pack_weights(path: Path, device: torch.device | str = "cpu") -> PackWeights:
    """The pack a weights file holds, rebuilt and loaded; UnreadableWeights names the file and what is wrong."""
    from safetensors import SafetensorError, safe_open

    def refuse(what: str):
        raise UnreadableWeights(f"{path}: {what}; not a pe_fast weights file (rerun the sweep to write it again)")

    if not path.is_file():
        raise UnreadableWeights(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as file:
            header = file.metadata() or {}
            shapes = {name: tuple(file.get_slice(name).get_shape()) for name in file.keys()}
            meta = _metadata(header, refuse)
            config = _model_config(meta["model_config"], refuse)
            _check_shapes(config, len(meta["model_ids"]), shapes, refuse)
            tensors = {name: file.get_tensor(name) for name in shapes}
    except SafetensorError as error:
        refuse(f"cannot be read ({str(error)[:120]})")
    except OSError as error:
        raise UnreadableWeights(f"{path} cannot be read ({error.strerror or error})")
    coordinates = tensors.pop(COORDINATES, None)
    if coordinates is not None and coordinates.dtype != torch.float64:
        refuse(f"its tensor {COORDINATES} is {coordinates.dtype}, not torch.float64")
    try:
        model = StackedTransformer(config, meta["seeds"], meta["sigmas"],
                                   None if coordinates is None else coordinates.numpy())
    except (ValueError, TypeError, RuntimeError) as error:  # a PE that needs coordinates
        refuse(f"does not hold a model of its own configuration ({str(error).splitlines()[0][:160]})")
    # load_state_dict converts a tensor to its parameter's dtype: integers would become weights without a word
    expected = model.state_dict()
    wrong = next((name for name, tensor in tensors.items()
                  if name in expected and tensor.dtype != expected[name].dtype), None)
    if wrong is not None:
        refuse(f"its tensor {wrong} is {tensors[wrong].dtype}, the model's {expected[wrong].dtype}")
    try:
        model.load_state_dict(tensors, strict=True)
    except (ValueError, TypeError, RuntimeError) as error:  # a tensor missing, extra or of a wrong shape
        refuse(f"does not hold a model of its own configuration ({str(error).splitlines()[0][:160]})")
    return PackWeights(model.to(device).eval(), list(meta["model_ids"]), meta["step"])


def _metadata(header: dict, refuse) -> dict:
    try:
        meta = json.loads(header["pe_fast"])
    except (KeyError, TypeError, ValueError, RecursionError):  # Python's JSON reader recurses: a crafted nesting
        refuse("its metadata lacks pe_fast's description of the pack")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        refuse(f"its format is not {FORMAT}")
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
    if not (fields["readout_token"] is None or type(fields["readout_token"]) is int):
        refuse("its model configuration's readout_token is not a token index")
    try:
        config = ModelConfig(**fields)
    except (TypeError, ValueError) as error:
        refuse(f"its model configuration is refused ({error})")
    if config.readout_token is not None and not 0 <= config.readout_token < config.num_tokens:
        refuse(f"its readout_token {config.readout_token} is not one of its {config.num_tokens} tokens")
    return config


def _check_shapes(config: ModelConfig, models: int, shapes: dict[str, tuple], refuse):
    """The configuration's sizes are those of the tensors in the file, before a model of that size is built: a
    tampered configuration cannot ask for more memory than the file holds."""
    expected = {"embed.weight": (models, config.token_dim, config.width),
                "head.weight": (models, config.width, config.out_dim)}
    for block in range(config.depth):
        expected[f"blocks.{block}.mlp_in.weight"] = (models, config.width, config.mlp_width)
    blocks = {name.split(".")[1] for name in shapes if name.startswith("blocks.")}
    if len(blocks) != config.depth:
        refuse(f"it holds {len(blocks)} blocks, its configuration {config.depth}")
    for name, shape in expected.items():
        if shapes.get(name) != shape:
            refuse(f"its tensor {name} is {shapes.get(name)}, its configuration's {shape}")
    token_tensors = {"absolute.tables.0": 1, "absolute.table0": 1, "absolute.fixed": 1, "rotary.cos": 0,
                     "relative.index": 0, COORDINATES: 0}
    for name, axis in token_tensors.items():
        if name in shapes and (len(shapes[name]) <= axis or shapes[name][axis] != config.num_tokens):
            refuse(f"its tensor {name} is {shapes[name]}: not {config.num_tokens} tokens")
