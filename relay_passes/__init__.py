"""Stage 1: Relax passes that assign operators to streams (Nimble) and annotate the IR."""
