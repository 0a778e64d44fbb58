"""Load a Hugging Face Hub name with TransformerLens: the version asked for (revision or training
checkpoint), a fast answer when the Hub cannot be reached, and the commit loaded, for the
provenance. Part of :func:`homoglens.models.loading.load_model`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from homoglens.core.errors import InvalidInputError, UnknownModelError
from homoglens.core.types import Backend
from homoglens.models.assets import EMBEDDED_MODELS, SHIPPED_MODELS
from homoglens.models.backends import LoadOptions, load_bridge, load_hub_hooked

__all__ = ["HUB_PROBE_TIMEOUT", "check_hub_version", "load_from_hub"]


def _official_name(name: str) -> str | None:
    from transformer_lens.supported_models import MODEL_ALIASES, OFFICIAL_MODEL_NAMES

    if name in OFFICIAL_MODEL_NAMES:
        return name
    for official, aliases in MODEL_ALIASES.items():
        if name in aliases:
            return official
    return None


HUB_PROBE_TIMEOUT = 3.0  # seconds; a reachable Hub answers a TCP connect well within this


def _hub_offline_reason(timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """Why the Hugging Face Hub cannot be reached, or ``None`` when it can (or in offline mode,
    ``HF_HUB_OFFLINE=1`` when huggingface_hub was imported: then the loaders read the local cache
    and fail fast themselves).

    One TCP connection to the Hub endpoint (``HF_ENDPOINT``) or to the HTTPS proxy, bounded by
    ``timeout`` seconds including the name lookup, so an offline machine learns it in seconds
    instead of after huggingface_hub's retries (about 40 s).
    """
    import socket
    import threading
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:  # read once, when huggingface_hub was imported
        return None
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    target = urlsplit(proxy if proxy and "://" in proxy else endpoint)
    host = target.hostname or "huggingface.co"
    port = target.port or (80 if target.scheme == "http" else 443)
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(f"{type(err).__name__}: {err}")

    thread = threading.Thread(target=probe, daemon=True)  # bounds the name lookup too
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"no answer from {host}:{port} within {timeout:g} s"
    return None if outcome[0] is None else f"{host}:{port} unreachable ({outcome[0]})"


@contextlib.contextmanager
def _cache_only(offline: str | None) -> Iterator[None]:
    """While a cached model loads from an unreachable Hub (``offline`` says why): huggingface_hub
    in offline mode, restored afterwards. Without it every file the loaders ask the Hub about
    (the tokenizer's file list, chat templates) waits through huggingface_hub's five retries
    with backoff: three minutes for a cached GPT-2 with the name lookup failing at once."""
    from huggingface_hub import constants

    if offline is None or constants.HF_HUB_OFFLINE:
        yield
        return
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = False


def _in_hub_cache(name: str, revision: Any) -> bool:
    """Whether the local Hugging Face cache holds ``name``'s config (at ``revision``): then an
    unreachable Hub is no reason to stop, as huggingface_hub falls back to the cache."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json", revision=revision)
    except Exception:  # a name or revision the cache cannot map
        return False
    return isinstance(found, str)


def _hub_revision(name: str, hub: dict[str, Any], resolved: str) -> str:
    """``"<what was asked> @ <commit>"`` of a model loaded from the Hub: the revision or
    checkpoint given (``"main"`` when none), and the commit of the snapshot in the local
    Hugging Face cache when it can be found (best effort; no network)."""
    import re

    asked = resolved or ", ".join(f"{k} {v}" for k, v in hub.items()) or "main"
    if set(hub) - {"revision"}:  # a checkpoint: TransformerLens picked the branch, not "main"
        return asked
    try:
        from huggingface_hub import try_to_load_from_cache

        branch = hub.get("revision")
        path = try_to_load_from_cache(name, "config.json", revision=branch)
    except Exception:  # a name the cache cannot map: the commit stays unknown
        return asked
    found = re.search(r"snapshots[/\\]([0-9a-f]{40})[/\\]", path) if isinstance(path, str) else None
    return f"{asked} @ {found.group(1)}" if found else asked


def _offline_advice() -> str:
    """What to do when a Hub name cannot be fetched: the offline switch, a folder, the models
    homoglens has without the Hub."""
    return (
        "If the model is in your Hugging Face cache, set HF_HUB_OFFLINE=1 (before starting "
        "Python) to load it from there; or pass a local folder (load_model('/path/to/folder'), "
        "a folder saved with model.save_pretrained and tokenizer.save_pretrained); or use a "
        f"model homoglens has offline: embedded {list(EMBEDDED_MODELS)}, shipped "
        f"{list(SHIPPED_MODELS)}."
    )


def check_hub_version(
    revision: Any, checkpoint_index: Any, checkpoint_value: Any
) -> tuple[dict[str, Any], str]:
    """Validate ``revision`` / ``checkpoint_index`` / ``checkpoint_value``; return the loader
    keywords and the provenance text (``""`` when none is given).

    Args:
        revision: A branch, tag or commit, or ``None``.
        checkpoint_index: TransformerLens' checkpoint index, or ``None``.
        checkpoint_value: The training step of a checkpoint, or ``None``.

    Returns:
        The keywords given (at most one) and their text, e.g. ``"revision step1000"``.

    Raises:
        InvalidInputError: a bad value, or more than one of the three.
    """
    from homoglens.core.validate import as_int

    out: dict[str, Any] = {}
    if revision is not None:
        if not isinstance(revision, str) or not revision.strip():
            raise InvalidInputError(
                f"revision={revision!r} must be a branch, tag or commit of the Hub repository "
                "(e.g. 'main', 'step1000')"
            )
        out["revision"] = revision
    if checkpoint_index is not None:
        out["checkpoint_index"] = as_int("checkpoint_index", checkpoint_index)
    if checkpoint_value is not None:
        out["checkpoint_value"] = as_int("checkpoint_value", checkpoint_value, low=0)
    if len(out) > 1:
        raise InvalidInputError(
            f"give one of revision=, checkpoint_index=, checkpoint_value=, not {sorted(out)}"
        )
    text = ", ".join(f"{key} {value}" for key, value in out.items())
    return out, text


def _load_hub_backend(name: str, resolved: str, options: LoadOptions, hub: dict[str, Any]) -> Any:
    """The TransformerLens loader of the resolved backend, for a Hub name."""
    if resolved == "hooked":
        return load_hub_hooked(
            name, options.device, options.dtype, options.process_weights, options.n_devices, hub
        )
    return load_bridge(
        name,
        None,
        options.device,
        options.dtype,
        options.process_weights,
        {**options.placement, **hub},
    )


def load_from_hub(
    name: str,
    backend: Backend,
    resolved: str,
    options: LoadOptions,
    hub: dict[str, Any],
    hub_text: str,
) -> tuple[Any, str, str, str]:
    """Load a Hub name with the backend resolved (``"auto"`` falls back to the bridge for a
    name ``HookedTransformer`` does not know).

    Args:
        name: The name as given.
        backend: The backend asked for (``"auto"``, ``"hooked"`` or ``"bridge"``).
        resolved: The backend ``backend`` resolved to.
        options: The checked load options.
        hub: The revision or checkpoint keywords (:func:`check_hub_version`).
        hub_text: Their provenance text.

    Returns:
        The model, the backend that loaded it, the provenance source and the revision text
        (``"<what was asked> @ <commit>"``).

    Raises:
        UnknownModelError: not a name TransformerLens knows, the Hub unreachable and the name
            not in the local cache, or the load failed.
        InvalidInputError: TransformerLens refused the checkpoint.
    """
    official = _official_name(name)
    if official is None and name.count("/") != 1:
        raise UnknownModelError(
            f"unknown model {name!r}: not an embedded model {list(EMBEDDED_MODELS)}, not a "
            f"shipped model {list(SHIPPED_MODELS)}, not an existing folder, and not a "
            "TransformerLens model name (e.g. 'gpt2', "
            "'EleutherAI/pythia-70m'; see transformer_lens.supported_models)."
        )
    if resolved == "hooked" and official is None and backend == "auto":
        resolved = "bridge"  # HookedTransformer knows only its official names
    source = hub_text
    offline = _hub_offline_reason()
    if offline is not None and not _in_hub_cache(official or name, hub.get("revision")):
        raise UnknownModelError(
            f"cannot load {name!r}: it is a Hugging Face Hub name and the Hub is not "
            f"reachable ({offline}). {_offline_advice()}"
        )
    try:
        with _cache_only(offline):
            model = _load_hub_backend(official or name, resolved, options, hub)
            resolved_step = getattr(model.cfg, "checkpoint_value", None)
            if resolved_step is not None and "checkpoint_index" in hub:
                source = f"{hub_text} (checkpoint_value {resolved_step})"
            revision_text = _hub_revision(official or name, hub, source)
    except (OSError, ValueError) as err:
        if hub and "checkpoint" in str(err):  # TransformerLens refused the checkpoint
            raise InvalidInputError(
                f"{sorted(hub)} for {name!r}: {err}. Pass revision= directly, or a model "
                "with published training checkpoints (EleutherAI/pythia-*)"
            ) from err
        raise UnknownModelError(
            f"could not load {name!r} from the Hugging Face Hub or its local cache "
            f"({str(err)[:300]}). Check the name and your network. {_offline_advice()}"
        ) from err
    return model, resolved, source, revision_text
