"""seqjax.models: complete models built from seqjax.nn."""

__all__: list[str] = []
