"""A ledger only its writer can vouch for: sealed with a key of this user's own, so a ledger
written by hand, copied from another folder or written by another user owns nothing; a shared
folder lets no file be replaced; a report is placed all or none; the file replaced is the one
checked, at the moment it is replaced."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

import xbackend.files.ledger_key as ledger_key
import xbackend.files.owned as owned
from tests.cli_helpers import one_line_error, relu_model, run
from xbackend.errors import UsageError
from xbackend.files.atomic import stage_bytes, write_atomic
from xbackend.files.ledger_key import key_file
from xbackend.files.owned import LEDGER, check_tree, is_ours, place

pytestmark = pytest.mark.unit  # the unit tier: make check

BASE = ("--backends", "ort-cpu", "--runs", "1", "--no-progress", "--probes", "none")
ROOT = os.geteuid() == 0


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _forged(folder: Path, files: dict[str, str], seal: str = "0" * 64) -> None:
    """A ledger as anyone could write it: the right schema, the right digests, any seal."""
    body = {"schema": "xbackend.files/2", "files": files, "seal": seal}
    (folder / LEDGER).write_text(json.dumps(body), "utf-8")


def test_a_forged_ledger_owns_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user's notes.md listed with its current digest in a ledger xbackend did not seal: the
    report is refused, exit 2, the notes intact; figures it lists as stale stay too."""
    model = relu_model(tmp_path)
    reports = tmp_path / "reports"
    reports.mkdir()
    notes = reports / "notes.md"
    notes.write_text("my notes\n", "utf-8")
    figures = [reports / f"notes.{slug}.png" for slug in ("error-depth", "ulp-distribution", "builds")]
    for f in figures:
        f.write_bytes(b"my figure")
    _forged(reports, {p.name: _sha(p) for p in (notes, *figures)})
    assert not is_ours(notes)
    code, _, err = run(capsys, "compare", str(model), *BASE, "--report", str(notes))
    assert code == 2
    one_line_error(err, f"--report {notes} exists and xbackend did not write it")
    assert notes.read_text("utf-8") == "my notes\n" and all(f.read_bytes() == b"my figure" for f in figures)
    # a new report beside them: the unsealed ledger (this user's, in xbackend's format) is
    # rewritten with what this run wrote, and its forged entries are gone, not trusted
    code, _, err = run(capsys, "compare", str(model), *BASE, "--report", str(reports / "new.md"))
    assert code == 0, err
    listed = json.loads((reports / LEDGER).read_text("utf-8"))["files"]
    assert "notes.md" not in listed and "new.md" in listed and not is_ours(notes)
    assert notes.read_text("utf-8") == "my notes\n" and all(f.read_bytes() == b"my figure" for f in figures)


def test_a_ledger_copied_to_another_folder_vouches_for_nothing_a_moved_one_still_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = relu_model(tmp_path)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    assert run(capsys, "compare", str(model), *BASE, "--report", str(first / "r.md"))[0] == 0
    assert is_ours(first / "r.md")
    for name in ("r.md", LEDGER):  # the same bytes, the same digests, the seal of another folder
        (second / name).write_bytes((first / name).read_bytes())
    assert not is_ours(second / "r.md")
    code, _, err = run(capsys, "compare", str(model), *BASE, "--report", str(second / "r.md"))
    assert code == 2, err
    assert (second / "r.md").read_bytes() == (first / "r.md").read_bytes()
    moved = tmp_path / "moved"
    first.rename(moved)  # the folder's identity goes with it: still xbackend's
    assert is_ours(moved / "r.md")
    assert run(capsys, "compare", str(model), *BASE, "--report", str(moved / "r.md"))[0] == 0


@pytest.mark.skipif(not ROOT, reason="another user's files are made with chown, which needs root")
def test_another_users_ledger_in_a_shared_folder_touches_nothing_of_ours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sticky folder every user writes (mode 1777): a ledger uid 65534 wrote there, listing
    root's notes with their digest, replaces nothing of root's; root's own report there is
    written once (new), then not replaced without --force (others may write the folder)."""
    model = relu_model(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = shared / "victim_notes.md"
    victim.write_text("root's notes\n", "utf-8")
    _forged(shared, {victim.name: _sha(victim)})
    os.chown(shared / LEDGER, 65534, 65534)
    code, _, err = run(capsys, "compare", str(model), *BASE, "--report", str(victim))
    assert code == 2 and victim.read_text("utf-8") == "root's notes\n"
    one_line_error(err, f"--report {victim} exists and xbackend did not write it")
    # nothing of a report is placed beside another user's ledger: no .layers.csv left behind
    code, _, err = run(capsys, "compare", str(model), *BASE, "--report", str(shared / "r.md"))
    assert code == 2
    one_line_error(err, "is not a ledger this user's xbackend can vouch for (another user's")
    assert sorted(p.name for p in shared.iterdir()) == [LEDGER, victim.name]
    (shared / LEDGER).unlink()
    assert run(capsys, "compare", str(model), *BASE, "--report", str(shared / "r.md"))[0] == 0
    assert not is_ours(shared / "r.md")  # listed and unchanged, but anyone may write the folder
    code, _, err = run(capsys, "compare", str(model), *BASE, "--report", str(shared / "r.md"))
    assert code == 2, err
    one_line_error(err, f"--report {shared / 'r.md'} exists in a folder others may write")
    assert run(capsys, "compare", str(model), *BASE, "--report", str(shared / "r.md"), "--force")[0] == 0


@pytest.mark.skipif(not ROOT, reason="another user's files are made with chown, which needs root")
def test_a_file_of_another_user_is_never_ours(tmp_path: Path) -> None:
    dest = tmp_path / "r.md"
    write_atomic(dest, "ours")
    assert is_ours(dest)
    os.chown(dest, 65534, 65534)
    assert not is_ours(dest)


def test_a_job_folder_with_a_forged_inner_ledger_is_never_replaced(tmp_path: Path) -> None:
    """A sweep's job folder, written by xbackend, then a user's notebook put in it with a
    forged ledger listing it: replacing or removing the folder is refused, naming the notebook."""
    job = tmp_path / "jobs" / "mlp" / "ort-cpu"
    job.mkdir(parents=True)
    write_atomic(job / "report.json", "{}")
    check_tree("the job folder", job)  # xbackend's alone: may be replaced
    notebook = job / "my_analysis.ipynb"
    notebook.write_text("{}", "utf-8")
    listed = json.loads((job / LEDGER).read_text("utf-8"))["files"]
    _forged(job, {**listed, notebook.name: _sha(notebook)})
    with pytest.raises(UsageError, match="which xbackend did not write") as e:
        check_tree("the job folder", job)
    assert "my_analysis.ipynb" in str(e.value) or LEDGER in str(e.value)
    assert notebook.exists()


def test_the_ledger_is_never_written_past_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ledger near its limit (compact: it never grows by rewriting) takes no file that would
    pass it: refused before anything is placed, and the folder's later writes still work."""
    monkeypatch.setattr(owned, "_LEDGER_LIMIT", 40_000)
    dest = tmp_path / "r.md"
    write_atomic(dest, "first")
    files = json.loads((tmp_path / LEDGER).read_text("utf-8"))["files"]
    per_entry = len(json.dumps({"f000000.csv": "0" * 64}, separators=(",", ":"))) - 1
    base = len(
        json.dumps({"schema": "xbackend.files/2", "files": files, "seal": "0" * 64}, separators=(",", ":"))
    )
    room = (40_000 - base - 1) // per_entry  # as many as fit: under 80 bytes of the limit left
    owned._write_ledger(tmp_path, {**files, **{f"f{i:06d}.csv": "0" * 64 for i in range(room)}})
    size = (tmp_path / LEDGER).stat().st_size
    assert 40_000 - per_entry < size <= 40_000
    write_atomic(dest, "again")  # a listed file replaced: the ledger keeps its size
    assert is_ours(dest) and (tmp_path / LEDGER).stat().st_size == size
    tmp = stage_bytes(tmp_path / "new.md", b"new", "report")
    with pytest.raises(UsageError, match=r"would pass its 40,000 bytes .* nothing was written"):
        owned.place_all([(tmp, tmp_path / "new.md", hashlib.sha256(b"new").hexdigest())], "report")
    tmp.unlink()
    assert not (tmp_path / "new.md").exists() and is_ours(dest)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_a_report_is_placed_whole_or_not_at_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bundle's last file (the Markdown) is someone's by the time it is placed: nothing of
    the bundle stays, not its table, not its figures, and the ledger is as it was."""
    model = relu_model(tmp_path)
    md = tmp_path / "r.md"
    real = owned._may_take

    def appears(dest: Path, files: dict[str, str], what: str, force: bool) -> Any:
        if dest == md and not md.exists():
            md.write_text("a user's file, made at that moment\n", "utf-8")
        return real(dest, files, what, force)

    owned._may_take = appears  # type: ignore[assignment]
    try:
        code, _, err = run(capsys, "compare", str(model), *BASE, "--report", str(md))
    finally:
        owned._may_take = real  # type: ignore[assignment]
    assert code == 2, err
    assert md.read_text("utf-8") == "a user's file, made at that moment\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.md", "relu.onnx"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "moved-aside"])
@pytest.mark.parametrize("edit", ["rename", "in-place"])
def test_an_edit_between_the_check_and_the_replace_is_never_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool, edit: str
) -> None:
    """The delay the attack used (every rename slowed by strace) planted where it bites: after
    the check, before the replace, the user's editor saves the file. The file actually replaced is
    checked: the edit survives, one line says so, no temp file is left; with and without the
    system's one-step exchange."""
    dest = tmp_path / "r.md"
    write_atomic(dest, "xbackend's report\n")
    real = owned._renameat2

    def delayed(src: Path, dst: Path, flags: int) -> bool:
        if dst == dest and flags == owned._RENAME_EXCHANGE and not delayed.done:  # type: ignore[attr-defined]
            delayed.done = True  # type: ignore[attr-defined]
            if edit == "rename":  # an editor's save: a new file renamed over the old one
                side = tmp_path / ".r.md.swp"
                side.write_text("the user's edit\n", "utf-8")
                os.replace(side, dest)
            else:
                with dest.open("w", encoding="utf-8") as f:
                    f.write("the user's edit\n")
        return real(src, dst, flags) if exchange else False

    delayed.done = False  # type: ignore[attr-defined]
    monkeypatch.setattr(owned, "_renameat2", delayed)
    tmp = stage_bytes(dest, b"xbackend's next report\n", "report")
    with pytest.raises(UsageError, match="changed while xbackend wrote it"):
        place(tmp, dest, hashlib.sha256(b"xbackend's next report\n").hexdigest(), "report")
    assert dest.read_text("utf-8") == "the user's edit\n"
    tmp.unlink(missing_ok=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [LEDGER, "r.md"]


def test_the_exchange_is_the_systems_own(tmp_path: Path) -> None:
    """renameat2(RENAME_EXCHANGE) swaps two files in one step here (Linux, this file system)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("a")
    b.write_text("b")
    if not owned._exchange(a, b):
        pytest.skip("this file system has no RENAME_EXCHANGE: the moved-aside path is tested above")
    assert (a.read_text(), b.read_text()) == ("b", "a")


def test_the_key_is_this_users_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made once, mode 0600, in the state folder; a key others could read or replace is refused
    with the line that says what to do, and doing it works."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    key = key_file()
    assert key == tmp_path / "state" / "xbackend" / "ledger.key"
    out = tmp_path / "out"
    out.mkdir()
    write_atomic(out / "r.md", "ours")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert is_ours(out / "r.md")
    ledger_key._KEYS.clear()
    key.chmod(0o644)
    with pytest.raises(UsageError, match=r"ledger key .* mode 0644, readable by others: remove it"):
        is_ours(out / "r.md")
    key.unlink()  # what the line says: a new key, and what the old one sealed is someone's now
    ledger_key._KEYS.clear()
    assert not is_ours(out / "r.md")
    write_atomic(out / "r.md", "ours again", force=True)
    assert is_ours(out / "r.md")
    ledger_key._KEYS.clear()
