"""On-policy regeneration: every assistant turn replaced by the target's own answer.

The draft learns to predict the target's next tokens, so the supervised tokens must be
exactly what the target emits: the token ids it generated, kept as generated (never
decoded and re-tokenized), reasoning block included, through its end-of-turn token.
Turns are regenerated in order: turn k's context holds the target's own answers to turns
< k (rendered back to text by the chat template, as a server does at inference).

:mod:`~eagle3_pipeline.data.regenerate.turns` holds what every backend shares (requests,
results, the resume cache) and the turn-by-turn loop; the backends generate:

- ``hf`` (:mod:`~eagle3_pipeline.data.regenerate.hf`): batched greedy ``generate``
  in-process (left padding, stop at end-of-turn).
- ``server`` (:mod:`~eagle3_pipeline.data.regenerate.server`): an OpenAI-compatible
  chat-completions server that returns token ids (vLLM), optionally started for the run.

Resume: every generation is appended to a JSONL cache. Its file is named by a
fingerprint of the target (config, tokenizer and chat template by content, so the
rendering is covered; the weights as ``model.fingerprint`` says) and the generation
settings; each entry is keyed by a hash of the request's messages, i.e. the conversation
so far with the target's own earlier answers in it. So another conversation set only adds
entries, and a rerun after a crash (or a larger ``train.samples``, whose conversations
extend the smaller run's) only generates what is missing.
"""
