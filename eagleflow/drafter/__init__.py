"""The EAGLE-3 drafter: model, draft vocabulary, data, trainer and engine formats.

Only `eagleflow.config.train` is importable without torch; the other modules are host-side.
"""
