"""One shard replica: a write log applied in order to a Xapian database, behind HTTP."""
