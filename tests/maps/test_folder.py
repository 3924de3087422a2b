from __future__ import annotations

import json
import pathlib

import pytest
import torch

from sgl_ridgefill.kernels.quant import dequantize_int8_groupwise
from sgl_ridgefill.maps import (
    FORMAT_VERSION,
    INT8_ELEMENT_BOUND,
    MapsError,
    identity_maps_folder,
    load_maps,
    refingerprint_maps_folder,
    write_maps_folder,
)
from sgl_ridgefill.maps import writer as writer_module

from .helpers import D, NUM_LAYERS, VOCAB, config, fingerprint, layer_weights, random_split, weights


def _write(path: pathlib.Path, quant: str = "bf16", splits=(1, 2), **kwargs) -> pathlib.Path:
    counts = torch.arange(VOCAB, dtype=torch.int64)
    return write_maps_folder(
        path, [random_split(s, seed=s) for s in splits], model=fingerprint(), quant=quant, group_size=16,
        token_counts=counts, calibration={"documents": 3, "tokens": 999, "longest_document_tokens": 512}, **kwargs,
    )


def test_bf16_round_trip(tmp_path):
    folder = load_maps(_write(tmp_path / "maps"))
    assert folder.splits == (1, 2)
    assert folder.default_split == 1
    assert folder.num_layers == NUM_LAYERS
    assert folder.layers(2) == (2, 3)
    expected = random_split(2, seed=2)
    A, b = folder.load_split(2, dtype=torch.float32)
    assert A.shape == (2, D, D) and b.shape == (2, D)
    assert A.dtype == b.dtype == torch.float32
    assert torch.equal(A, expected.A.to(torch.bfloat16).float())
    assert torch.allclose(b, expected.b.float())
    assert folder.load_split_int8(2) is None
    assert folder.quant(2) == "bf16"
    assert folder.resident_bytes(2) == 2 * (D * D + D) * 2
    assert folder.resident_bytes(2, dtype=torch.float32) == 2 * (D * D + D) * 4
    assert torch.equal(folder.token_counts(), torch.arange(VOCAB, dtype=torch.int64))
    manifest = folder.manifest
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["d_in"] == manifest["d_out"] == D
    assert manifest["splits"]["1"]["lambda"] == 0.03
    assert manifest["calibration"]["longest_document_tokens"] == 512
    assert set(manifest["files"]) == {"maps-split1.safetensors", "maps-split2.safetensors", "token_counts.safetensors"}
    assert manifest["token_counts"]["total"] == sum(range(VOCAB))
    assert manifest["map_kind"] == folder.kind.name == "residual"
    manifest.pop("map_kind")
    (tmp_path / "maps" / "manifest.json").write_text(json.dumps(manifest))
    assert load_maps(tmp_path / "maps").kind.name == "residual"  # a folder written before map kinds


def test_int8_round_trip_and_error_bound(tmp_path):
    folder = load_maps(_write(tmp_path / "maps", quant="int8"))
    expected = random_split(1, seed=1)
    q, scale, b, group_size = folder.load_split_int8(1)
    assert group_size == 16
    assert q.dtype == torch.int8 and q.shape == (3, D, D)
    assert scale.dtype == torch.float32 and scale.shape == (3, D, D // 16)
    A, b2 = folder.load_split(1, dtype=torch.float64)
    assert torch.equal(A[0], dequantize_int8_groupwise(q[0], scale[0], 16, torch.float64))
    # Every element is within half a quantisation step: 1/254 of its group's largest magnitude.
    group_max = expected.A.abs().reshape(3, D, D // 16, 16).amax(-1, keepdim=True)
    err = (A - expected.A).abs().reshape(3, D, D // 16, 16)
    assert bool((err <= group_max * INT8_ELEMENT_BOUND * (1 + 1e-5)).all())
    worst = max(float((A[i] - expected.A[i]).norm() / expected.A[i].norm()) for i in range(3))
    assert folder.manifest["splits"]["1"]["storage_max_rel_error"] == pytest.approx(worst, rel=1e-4)
    assert 0 < worst < 0.01
    assert folder.resident_bytes(1, dtype=torch.int8) == 3 * (D * D + 4 * D * (D // 16) + 4 * D)


def test_bf16_storage_error_is_recorded(tmp_path):
    folder = load_maps(_write(tmp_path / "maps"))
    err = folder.manifest["splits"]["1"]["storage_max_rel_error"]
    assert 0 < err < 2**-8


def test_identity_folder_has_identity_maps(tmp_path):
    embed, norm = weights()
    path = identity_maps_folder(
        tmp_path / "id", config=config(), embed_weight=embed, final_norm_weight=norm, layers=layer_weights(), split=3
    )
    folder = load_maps(path)
    A, b = folder.load_split(3, dtype=torch.float32)
    assert torch.equal(A, torch.eye(D).expand(1, D, D))
    assert torch.equal(b, torch.zeros(1, D))
    assert folder.check_model(fingerprint()) == []
    assert folder.token_counts() is None
    with pytest.raises(ValueError, match=r"split 4 is outside 1\.\.3 for a model with 4 layers"):
        identity_maps_folder(tmp_path / "bad", config=config(), embed_weight=embed, final_norm_weight=norm, split=4)


def test_existing_folder_is_not_overwritten_without_force(tmp_path):
    path = _write(tmp_path / "maps")
    with pytest.raises(MapsError) as info:
        _write(path)
    assert str(info.value) == f"maps folder {path} already exists (use --force to replace it)"
    _write(path, splits=(3,), force=True)
    assert load_maps(path).splits == (3,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maps"]


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(writer_module, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        _write(tmp_path / "maps")
    assert list(tmp_path.iterdir()) == []


def test_tampered_file_is_refused(tmp_path):
    path = _write(tmp_path / "maps")
    data = bytearray((path / "maps-split2.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (path / "maps-split2.safetensors").write_bytes(bytes(data))
    with pytest.raises(MapsError) as info:
        load_maps(path)
    manifest = json.loads((path / "manifest.json").read_text())
    import hashlib

    actual = hashlib.sha256(bytes(data)).hexdigest()
    assert str(info.value) == (
        f"maps folder {path}: maps-split2.safetensors fails its sha256 check (manifest "
        f"{manifest['files']['maps-split2.safetensors'][:12]}, file {actual[:12]}); the folder was changed after it was written"
    )
    assert load_maps(path, verify=False).splits == (1, 2)


def test_missing_file_and_bad_manifest(tmp_path):
    path = _write(tmp_path / "maps")
    (path / "token_counts.safetensors").unlink()
    with pytest.raises(MapsError) as info:
        load_maps(path)
    assert str(info.value) == f"maps folder {path}: file token_counts.safetensors listed in manifest.json is missing"
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MapsError) as info:
        load_maps(path)
    assert str(info.value) == (
        f"maps folder {path}: format version {FORMAT_VERSION + 1} is not supported; this sgl-ridgefill reads "
        f"version {FORMAT_VERSION} (re-run calibration, or use a matching sgl-ridgefill)"
    )
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(MapsError, match="manifest.json is not valid JSON"):
        load_maps(path)
    (path / "manifest.json").unlink()
    with pytest.raises(MapsError) as info:
        load_maps(path)
    assert str(info.value) == f"{path} is not a maps folder: it has no manifest.json"
    with pytest.raises(MapsError) as info:
        load_maps(tmp_path / "nowhere")
    assert str(info.value) == f"maps folder {tmp_path / 'nowhere'} does not exist"


def test_manifest_cannot_point_outside_the_folder(tmp_path):
    path = _write(tmp_path / "maps")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["../secret"] = "0" * 64
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MapsError, match="lists file '../secret' outside the folder"):
        load_maps(path)


def test_unknown_split_is_named(tmp_path):
    folder = load_maps(_write(tmp_path / "maps"))
    with pytest.raises(MapsError) as info:
        folder.load_split(3)
    assert str(info.value) == f"maps folder {folder.path} has no maps for split 3; it has split(s) 1, 2"


def test_check_model_raises_on_mismatch_and_warns_on_requantisation(tmp_path):
    folder = load_maps(_write(tmp_path / "maps"))
    with pytest.raises(MapsError) as info:
        folder.check_model(fingerprint(num_hidden_layers=8, hidden_size=64, head_dim=12))
    assert str(info.value) == (
        f"maps folder {folder.path} does not match the served model: "
        "model hidden_size: maps were fitted on 48, served model has 64; "
        "model num_hidden_layers: maps were fitted on 4, served model has 8"
    )
    embed, norm = weights()
    g = torch.Generator().manual_seed(3)
    requantised = embed.float() + 0.001 * torch.randn(embed.shape, generator=g)
    from sgl_ridgefill.maps import model_fingerprint

    warnings = folder.check_model(model_fingerprint(config(), requantised, norm.float(), layer_weights()))
    assert len(warnings) == 1 and warnings[0].startswith("model weights: checksum differs but the weights are close")
    assert folder.check_tokenizer({"kind": "tokenizer", "vocab_size": 5}) == [
        f"maps folder {folder.path} records no tokenizer fingerprint; tokenizer not checked"
    ]


def test_inconsistent_inputs_are_value_errors(tmp_path):
    split = random_split(2)
    with pytest.raises(ValueError, match=r"split 4 is outside 1\.\.3"):
        write_maps_folder(tmp_path / "a", [random_split(2).__class__(4, split.A, split.b)], model=fingerprint())
    with pytest.raises(ValueError, match=r"split 1: A has shape \(2, 48, 48\), expected \(3, 48, 48\)"):
        write_maps_folder(tmp_path / "a", [random_split(2).__class__(1, split.A, split.b)], model=fingerprint())
    with pytest.raises(ValueError, match="quant must be one of"):
        write_maps_folder(tmp_path / "a", [split], model=fingerprint(), quant="fp8")
    assert not (tmp_path / "a").exists()


def _edit_manifest(path: pathlib.Path, **changes) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_folder_without_a_model_fingerprint_is_refused(tmp_path):
    path = _write(tmp_path / "maps")
    _edit_manifest(path, model=None)
    folder = load_maps(path)
    with pytest.raises(MapsError) as info:
        folder.check_model(fingerprint())
    assert str(info.value) == (
        f"maps folder {path} records no model fingerprint, so nothing ties it to the model it was fitted on; re-fit "
        f"it with `sgl-ridgefill calibrate`, or record the fingerprint of the model it was fitted on with "
        f"`sgl-ridgefill calibrate fingerprint --maps {path} --model MODEL`"
    )


def test_folder_whose_fingerprint_lost_a_key_is_refused(tmp_path):
    path = _write(tmp_path / "maps")
    model = {k: v for k, v in fingerprint().items() if k != "num_key_value_heads"}
    _edit_manifest(path, model=model)
    with pytest.raises(MapsError) as info:
        load_maps(path).check_model(fingerprint())
    assert str(info.value) == (
        f"maps folder {path} does not match the served model: "
        "model num_key_value_heads: the maps folder's fingerprint does not record it; served model has 2"
    )


def test_refingerprint_records_the_model_of_an_old_folder(tmp_path):
    path = _write(tmp_path / "maps")
    _edit_manifest(path, model=fingerprint(layers=False))
    assert len(load_maps(path).check_model(fingerprint())) == 1  # only embeddings and final norm checked
    warnings = refingerprint_maps_folder(path, model=fingerprint(), tokenizer={"kind": "tokenizer", "vocab_size": 5})
    assert warnings == [
        "model layers: the maps folder records no per-layer fingerprint (written by an older sgl-ridgefill), so only "
        "the embeddings and final norm were checked against the served model; record one with `sgl-ridgefill "
        "calibrate fingerprint --maps MAPS --model MODEL`"
    ]
    with pytest.raises(ValueError, match="the model fingerprint has no per-layer part"):
        refingerprint_maps_folder(path, model=fingerprint(layers=False))
    folder = load_maps(path)
    assert folder.check_model(fingerprint()) == []
    assert folder.manifest["model"] == fingerprint()
    assert folder.manifest["tokenizer"] == {"kind": "tokenizer", "vocab_size": 5}
    assert folder.load_split(2)[0].shape == (2, D, D)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maps"]


def test_refingerprint_fills_in_a_null_model(tmp_path):
    path = _write(tmp_path / "maps")
    _edit_manifest(path, model=None)
    assert refingerprint_maps_folder(path, model=fingerprint()) == []
    assert load_maps(path).check_model(fingerprint()) == []


def test_refingerprint_refuses_another_model_unless_forced(tmp_path):
    path = _write(tmp_path / "maps")
    _edit_manifest(path, model=fingerprint(layers=False))
    with pytest.raises(MapsError) as info:
        refingerprint_maps_folder(path, model=fingerprint(seed=1))
    assert str(info.value).startswith(f"maps folder {path} does not match the served model: model weights: checksum differs")
    assert str(info.value).endswith("; pass --force to record the new model's fingerprint anyway")
    assert refingerprint_maps_folder(path, model=fingerprint(seed=1), force=True) == []
    assert load_maps(path).check_model(fingerprint(seed=1)) == []
    with pytest.raises(MapsError) as info:
        refingerprint_maps_folder(path, model=fingerprint(hidden_size=64, num_hidden_layers=8, head_dim=12), force=True)
    assert str(info.value) == (
        f"maps folder {path} holds maps for 4 layers of width 48 -> 48; the model has 8 layers of width 64, so its "
        "fingerprint cannot be recorded there"
    )


def test_calibration_dtype_is_recorded_and_older_folders_still_load(tmp_path):
    assert load_maps(_write(tmp_path / "f32", calibration_dtype="float32")).calibration_dtype == "float32"
    assert load_maps(_write(tmp_path / "none")).calibration_dtype is None
    # A folder written before the field existed: no "calibration_dtype" key, the dtype only in the summary.
    old = _write(tmp_path / "old")
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["calibration_dtype"]
    manifest["calibration"]["dtype"] = "bfloat16"
    (old / "manifest.json").write_text(json.dumps(manifest))
    folder = load_maps(old)
    assert folder.calibration_dtype == "bfloat16" and folder.check_model(fingerprint()) == []
