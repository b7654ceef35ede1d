"""Settings every test shares.

Hypothesis keeps no example database here: an example it finds that fails is printed (with the blob that replays
it) and must be written into the test as an `@example`, so that a failure found once on one machine never hides in
a local `.hypothesis/` folder, replayed on every later run there and never on CI's fresh clone (the way
`trainplan launch -1 ''` once made the command-line fuzz test fail on a clean tree).
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("trainplan", database=None, print_blob=True)
settings.load_profile("trainplan")
