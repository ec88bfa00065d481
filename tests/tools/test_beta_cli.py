"""``pasa-beta``'s command line: bad settings end with one line and exit 2; the help
names the command."""
from __future__ import annotations

import pytest

from pasa_npu.tools.beta import main


@pytest.mark.parametrize("argv, needle", [
    (["--n", "64", "--scale", "1e-30"], "no solution in (0, 1) from beta0=0.9 for n=64"),
    (["--scale", "1e30"], "no solution in (0, 1)"),
    (["--scale", "nan"], "scale must be a finite positive number, got nan"),
    (["--beta0", "1"], "beta0 must lie in (0, 1), got 1.0"),
])
def test_bad_settings_end_in_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pasa-beta: error: ") and needle in err[0], err


def test_help_starts_with_the_commands_name(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "\npasa-beta: the optimal accuracy condition" in out and "python -m" not in out
    assert "(default: the paper's 0.9 0.9375 0.96875 0.984375 0.99 0.999)" in " ".join(out.split())
