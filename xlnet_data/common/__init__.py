"""Plumbing every room uses and that knows nothing of XLNet's data: files (local, gs://, compressed), worker
processes, signals, progress, memory, the compiled-code decorator and the root of user errors."""
