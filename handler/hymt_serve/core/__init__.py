"""Shared by the request side and the engine (pure Python, no torch, no HTTP): settings, the
values that go into the engine and come out, and the domain errors."""
