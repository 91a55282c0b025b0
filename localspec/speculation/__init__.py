"""One speculative step and the loop of them: the draft tree, the state owner, verification
and sampling, the probe that measures a step's costs, and the generation loop. The draft
sources live in ``sources``."""
