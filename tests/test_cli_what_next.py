"""The last lines of `router-lite run`: the serve command as a fresh shell finds it (`make run` installs into .venv,
whose bin/ is not on PATH: the plain name would be `command not found`)."""
from cli.summary import cli_command, what_next


def _venv(tmp_path):
    bin_ = tmp_path / "repo" / ".venv" / "bin"
    bin_.mkdir(parents=True)
    for f in ("router-lite", "activate"):
        (bin_ / f).write_text("")
    return bin_


def test_a_venv_not_on_path_is_named_by_its_path_and_its_activate_line(tmp_path):
    bin_ = _venv(tmp_path)
    exe, activate = cli_command(bin_, tmp_path / "repo", which=lambda _: None)
    assert exe == ".venv/bin/router-lite" and activate == "source .venv/bin/activate"
    text = what_next("demo", (exe, activate))
    assert "  .venv/bin/router-lite serve    #" in text and "`source .venv/bin/activate` first" in text
    assert "\n  router-lite serve" not in text
    # from a folder the script is not below: the absolute path
    (tmp_path / "elsewhere").mkdir()
    other = cli_command(bin_, tmp_path / "elsewhere", which=lambda _: "/usr/bin/router-lite")
    assert other[0] == str(bin_ / "router-lite")


def test_the_plain_name_when_path_finds_this_install(tmp_path):
    bin_ = _venv(tmp_path)
    found = cli_command(bin_, tmp_path / "repo", which=lambda _: str(bin_ / "router-lite"))
    assert found == ("router-lite", None)
    assert "  router-lite serve --profile smoke    #" in what_next("smoke", found)
