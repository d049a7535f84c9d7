"""The web front end (``hymt web``): the translation page and its API (:mod:`.app`), Chimera
refinement across two models (:mod:`.refine`), and the LibreTranslate and DeepL compatible APIs
with the front end's own keys (:mod:`.compat`, :mod:`.keys`)."""
