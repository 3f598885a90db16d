"""Image outputs: output paths checked before any work starts (a bad `--out` is a one-line error in the first
second, not a traceback after minutes of generating or measuring), the PNG `parameters` text every writer embeds
(the CLI's files, the server's answers), and PNGs written whole under names no other run has taken."""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path

from .atomic import atomic_path, fsync_file, remove_stale_temps, temp_path
from .errors import UsageError


def _probe_write(folder: Path, what: str, shown: str | Path) -> None:
    """Create and remove a uniquely named empty file in `folder`: the one check that answers for permissions,
    read-only file systems and pseudo file systems alike."""
    try:
        handle, name = tempfile.mkstemp(dir=folder, prefix=".sdaccel-write-check-")
    except OSError as exc:
        raise UsageError(f"{what} {shown}: cannot write there ({exc.strerror or exc.__class__.__name__})") from None
    os.close(handle)
    os.unlink(name)


def prepare_output_folder(path: str | Path, what: str = "--out") -> Path:
    """`path` as a folder sdaccel can write into: created when absent (with its parents), else UsageError saying
    why not (it is a file, it cannot be created, it is not writable)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{what} {path}: exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot create the folder "
                         f"({exc.strerror or exc.__class__.__name__})") from None
    _probe_write(folder, what, path)
    return folder


def check_can_create(path: str | Path, what: str = "--out") -> None:
    """UsageError unless `path` could be created: its nearest existing ancestor is a writable folder. Creates
    nothing (for outputs that are written elsewhere and renamed into place at the end)."""
    target = Path(path).absolute()
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{what} {path}: {ancestor} is not a folder")
    _probe_write(ancestor, what, path)


# ------------------------------------------------------------------------------------------------------ images


def png_parameters(params: dict, index: int) -> str:
    """The 'parameters' text chunk in the format image tools (A1111, ComfyUI importers) read."""
    lines = [params["prompt"]]
    if params.get("negative_prompt"):
        lines.append(f"Negative prompt: {params['negative_prompt']}")
    lines.append(
        f"Steps: {params['steps']}, Sampler: {params['scheduler']}, CFG scale: {params['guidance']}, "
        + (f"Seed: {_image_seed(params, index)}, " if params.get("seed") is not None else "")
        + f"Size: {params['width']}x{params['height']}, Model: {params['model']}, "
        f"Batch index: {index}, Engine: {params['engine']}, Dtype: {params['dtype']}, "
        f"Timestep spacing: {params['timestep_spacing']}, Prediction type: {params['prediction_type']}, "
        + (f"Preset: {params['preset']}, " if params.get("preset") else "")
        + (f"Clip skip: {params['clip_skip'] + 1}, " if params.get("clip_skip") else "")  # A1111 counts from 1
        + (f"Variation seed: {_image_subseed(params, index)}, Variation seed strength: "
           f"{params['subseed_strength']}, " if params.get("subseed_strength") else "")
        + (f"Denoising strength: {params['strength']}, " if params.get("strength") is not None else "")
        + _hires_parameters(params)
        + (f"Workload: {params['workload']}, " if params.get("workload", "txt2img") != "txt2img" else "")
        + (f"Mask blur: {params['mask_blur']}, " if params.get("mask_blur") else "")
        + (f"Keep unmasked: {params['keep_unmasked']}, " if params.get("keep_unmasked") else "")
        + (f"Refiner start: {params['refiner_start']}, " if params.get("refiner_start") is not None else "")
        + (f"Aesthetic score: {params['aesthetic_score']}, " if params.get("aesthetic_score") is not None else "")
        + ("ControlNets: " + " ".join(f"{Path(net).name}:{scale}" for net, scale in zip(
            params["controlnets"], params["controlnet_scale"])) + ", " if params.get("controlnets") else "")
        + ("IP-Adapters: " + " ".join(f"{Path(k).name}:{v}" for k, v in params["ip_adapters"].items()) + ", "
           if params.get("ip_adapters") else "")
        + ("LoRAs: " + " ".join(f"{Path(k).name}:{v}" for k, v in params["loras"].items()) + ", "
           if params.get("loras") else "")
        + ('TI hashes: "' + ", ".join(f"{k}: {v}" for k, v in params["embeddings"].items()) + '", '
           if params.get("embeddings") else "")
        + "Generator: sdaccel"
    )
    return "\n".join(lines)


def _hires_parameters(params: dict) -> str:
    """Hires fix's entries as A1111 writes them ("Hires upscale: 2, Hires steps: 20, Hires upscaler: Latent, "), or
    "" without hires fix."""
    if not params.get("hires_upscaler"):
        return ""
    resize = params.get("hires_resize")
    text = f"Hires resize: {resize[0]}x{resize[1]}, " if resize else f"Hires upscale: {params['hires_scale']:g}, "
    text += f"Hires steps: {params['hires_steps']}, Hires upscaler: {params['hires_upscaler']}, "
    for key, name in (("hires_scheduler", "Hires sampler"), ("hires_prompt", "Hires prompt"),
                      ("hires_negative_prompt", "Hires negative prompt")):
        if params.get(key) is not None:
            text += f"{name}: {_quoted(params[key])}, "
    return text


def _quoted(text: str) -> str:
    """A value as A1111's infotext quotes it: as a JSON string when a comma, colon or newline would split it."""
    import json

    return json.dumps(text, ensure_ascii=False) if any(c in text for c in ",:\n") else text


def _image_seed(params: dict, index: int):
    """Image `index`'s own seed: its entry of per-image seeds, else the call's seed."""
    seeds = params.get("seeds")
    return seeds[index] if seeds else params["seed"]


def _image_subseed(params: dict, index: int):
    """Image `index`'s variation seed: its own (a server's per-image params), else its entry of the call's."""
    return params["subseed"] if "subseed" in params else params["subseeds"][index]


def image_names(out_dir: Path, stem: str, seed: int, count: int, attempt: int) -> list[Path]:
    """The names of one call's images: `{stem}-{seed}-{i:02d}.png`, and for a later run whose names are taken,
    the same with `-{attempt}` (2, 3, ...)."""
    suffix = "" if attempt == 1 else f"-{attempt}"
    return [out_dir / f"{stem}-{seed}-{i:02d}{suffix}.png" for i in range(count)]


def save_images(result, out_dir: Path, stem: str = "image", overwrite: bool = False) -> list[Path]:
    """Write the images as PNGs with their parameters, each complete under a temporary name before it gets its own.
    Without `overwrite` no existing file is replaced: a taken name moves the whole call to the next free names, and
    the final step is a hard link, which fails rather than replace a file another run wrote meanwhile."""
    from PIL.PngImagePlugin import PngInfo

    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out_dir, f".{glob.escape(stem)}-*.part")  # what killed runs left
    seed, count = result.params["seed"], len(result.images)
    seed = "generator" if seed is None else seed  # noise from the caller's generator: no seed to name
    attempt = 1
    while not overwrite and any(p.exists() for p in image_names(out_dir, stem, seed, count, attempt)):
        attempt += 1
    written = []
    for i, image in enumerate(result.images):
        meta = PngInfo()
        meta.add_text("parameters", png_parameters(result.params, i))
        path = image_names(out_dir, stem, seed, count, attempt)[i]
        if overwrite:
            with atomic_path(path) as tmp:  # never a half-written PNG under the final name
                image.save(tmp, format="PNG", pnginfo=meta)
            written.append(path)
            continue
        tmp = temp_path(path, "part")
        try:
            image.save(tmp, format="PNG", pnginfo=meta)
            fsync_file(tmp)
            while True:
                try:
                    os.link(tmp, path)
                    break
                except FileExistsError:
                    attempt += 1
                    path = image_names(out_dir, stem, seed, count, attempt)[i]
                except OSError:  # a file system without hard links: the check above, then a rename
                    os.replace(tmp, path)
                    break
        except OSError as exc:
            if exc.filename is None:  # a full disk names no file: name the image being written
                exc.filename = os.fspath(path)
            raise
        finally:
            if tmp.exists():
                tmp.unlink()
        written.append(path)
    return written
