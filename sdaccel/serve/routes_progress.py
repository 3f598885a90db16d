"""A1111's progress, interrupt and skip (/sdapi/v1/progress, /interrupt, /skip), on the worker's running call.

/progress answers A1111's shape: the fraction and ETA of the running call, its state (sampling_step, job_count, and
whether a client interrupted or skipped it) and current_image, the call's newest live preview of image 0 as a base64
PNG (previews.py; `sdaccel serve --preview-every N`), unless A1111's skip_current_image=true leaves it out; it is
encoded here, when asked, never by the worker. /interrupt and /skip stop the running call at its next step boundary,
its images decoded from the latents reached (progress.py says how both map onto A1111's), and answer at once as
A1111 does ({} and null), whether a call ran or not. Each takes no parameter but A1111's: any other is a 400.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request

from .context import served
from .middleware import ApiError

router = APIRouter(prefix="/sdapi/v1")


def _only_query(request: Request, *known: str) -> None:
    """A 400 naming the query parameters A1111's endpoint does not take (sdaccel would not honour them)."""
    unknown = sorted(set(request.query_params) - set(known))
    if unknown:
        takes = f"it takes {', '.join(known)}" if known else "it takes none"
        raise ApiError(400, f"unknown query parameter(s) {', '.join(unknown)}: {takes}")


@router.get("/progress")
async def progress(request: Request, skip_current_image: bool = False):
    _only_query(request, "skip_current_image")
    worker = served(request).worker
    snap = worker.progress.snapshot()
    steps, step = snap.get("steps") or 0, snap.get("step") or 0
    fraction = min(1.0, step / steps) if steps else 0.0
    elapsed = time.monotonic() - snap["started"] if snap else 0.0
    eta = elapsed / fraction - elapsed if fraction > 0 else 0.0
    queued = worker.queue_depth()
    preview = worker.progress.preview() if snap and not skip_current_image else None
    image = None if preview is None else await asyncio.to_thread(preview.png_b64)
    return {"progress": fraction, "eta_relative": eta,
            "state": {"skipped": bool(snap.get("skipped")), "interrupted": bool(snap.get("interrupted")),
                      "job": "txt2img" if snap else "", "job_count": queued + (1 if snap else 0),
                      "job_timestamp": "0", "job_no": 0, "sampling_step": step, "sampling_steps": steps},
            "current_image": image, "textinfo": f"{snap.get('images', 0)} image(s), {queued} job(s) queued"
            if snap else None}


@router.post("/interrupt")
async def interrupt(request: Request):
    """A1111's Interrupt: the running call stops at its next step and answers the images reached; the queue runs
    on. {} as A1111 answers, a call running or not."""
    _only_query(request)
    served(request).worker.interrupt(skip=False)
    return {}


@router.post("/skip")
async def skip(request: Request):
    """A1111's Skip: the running call stops as with interrupt (a call is sdaccel's batch iteration) and the next
    queued one starts. null as A1111 answers, a call running or not."""
    _only_query(request)
    served(request).worker.interrupt(skip=True)
    return None
