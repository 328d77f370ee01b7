"""Thin DVC stage entrypoints: config in, one library call, outputs and metrics out."""
