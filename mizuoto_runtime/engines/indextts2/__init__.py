"""IndexTTS-2 in our own model code.

Written from reading upstream (github.com/index-tts/index-tts, commit ee40fa7) as a
specification; no upstream code is copied (its licence forbids it). Proved equal to upstream
on `../shared/fixtures/indextts2/` by `mizuoto check-reference --engine indextts2 DIR`.
"""
