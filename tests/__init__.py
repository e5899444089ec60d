# The built-in node kinds register themselves with pipeline.kinds when the package is imported.
import nodes  # noqa: F401
