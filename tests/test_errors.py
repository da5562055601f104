"""The errors of the tools, MCP and file-server layers are OllieErrors, and keep what their own
`except` clauses and readers rely on (ValueError, errno, ename, message)."""

import errno as E

import pytest

from ollie.mcp import Unavailable
from ollie.tools.execute import StepError
from ollie.types import InvalidValue, OllieError
from ollie.vfs.namespace import FsError
from ollie.vfs.ninep_client import RemoteError


def test_a_bad_execute_code_argument_is_an_invalid_value_and_still_a_value_error():
    with pytest.raises(InvalidValue, match="steps: must be"):
        raise StepError("steps: must be a non-empty list")
    assert issubclass(StepError, ValueError) and issubclass(StepError, OllieError)


def test_an_unavailable_mcp_server_is_an_ollie_error():
    e = Unavailable("no answer within 20 s")
    assert isinstance(e, OllieError) and str(e) == "no answer within 20 s"


def test_a_file_error_keeps_its_errno_and_message():
    e = FsError(E.ENOENT, "notes: no such file")
    assert isinstance(e, OllieError)
    assert (e.errno, e.message, str(e)) == (E.ENOENT, "notes: no such file", "notes: no such file")
    bare = FsError(E.EACCES)
    assert (bare.message, str(bare)) == ("Permission denied", "EACCES")


def test_a_9p_server_error_is_a_file_error_with_its_ename():
    e = RemoteError("s/9: no such file", E.ENOENT)
    assert isinstance(e, FsError) and isinstance(e, OllieError)
    assert e.errno == E.ENOENT and e.ename == e.message == str(e) == "s/9: no such file"
    assert RemoteError("connection lost").errno == E.EIO  # no errno of its own: EIO, as before
