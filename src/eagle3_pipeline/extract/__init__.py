"""The target's hidden states for every prepared row, in speculators' on-disk format.

Two backends write the same files under the same manifest: :mod:`.hf_backend` (the
target's language model in this process) and :mod:`.vllm_backend` (a vLLM server).
What they share: :mod:`.layout` (paths, file names and the file format),
:mod:`.extraction` (checks before the first batch), :mod:`.rows`, :mod:`.fingerprint`,
:mod:`.manifest` (what a rerun may reuse) and :mod:`.writer` (atomic file writes).
"""
