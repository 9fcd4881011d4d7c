//! CI and pull-request bot support (comment grammar, summaries).
