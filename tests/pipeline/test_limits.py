"""The one steps/size/images rule (sdaccel/pipeline/limits.py): the library's bounds and the server's stricter ones,
each refusal naming its bound and, on a server, the flag that sets it."""

import pytest

from sdaccel.errors import UsageError
from sdaccel.pipeline.limits import LIBRARY, SERVER, GenerationLimits
from sdaccel.pipeline.request import validate_request


def test_library_bounds_are_the_schedule_and_the_side():
    LIBRARY.check(steps=1000, height=16384, width=8, images=64)
    with pytest.raises(UsageError, match=r"^steps must be an integer from 1 to 1000, got 1001$"):
        LIBRARY.check(steps=1001)
    with pytest.raises(UsageError, match=r"^width must be a multiple of 8 from 8 to 16384, got 12$"):
        LIBRARY.check(width=12)
    with pytest.raises(UsageError, match=r"^batch size must be an integer >= 1, got 0$"):
        LIBRARY.check(images=0)


def test_server_bounds_name_their_flags():
    SERVER.check(steps=150, height=2048, width=2048, images=8)
    with pytest.raises(UsageError, match=r"^steps must be an integer from 1 to 150 on this server \(--max-steps\), "
                                         r"got 151$"):
        SERVER.check(steps=151)
    with pytest.raises(UsageError, match=r"from 8 to 2048 on this server \(--max-side\), got 2056$"):
        SERVER.check(height=2056)
    with pytest.raises(UsageError, match=r"^n must be an integer from 1 to 8 on this server \(--max-images\), got 9$"):
        SERVER.check(images=9, images_name="n")


@pytest.mark.parametrize("value", [True, 2.0, "4", None])
def test_steps_are_integers_not_look_alikes(value):
    with pytest.raises(UsageError, match="steps must be an integer"):
        LIBRARY.check_steps(value)


def test_validate_request_takes_the_limits_it_is_given():
    validate_request(200, 512, 512)
    with pytest.raises(UsageError, match=r"--max-steps"):
        validate_request(200, 512, 512, limits=SERVER)
    validate_request(200, 512, 512, limits=GenerationLimits(max_steps=200))


@pytest.mark.parametrize("kwargs", [dict(max_steps=0), dict(max_steps=1001), dict(max_side=4), dict(max_images=0)])
def test_limits_themselves_are_checked(kwargs):
    with pytest.raises(UsageError):
        GenerationLimits(**kwargs)
