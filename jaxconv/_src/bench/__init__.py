"""The benchmark runner of ``jaxconv bench`` and the benchdnn shape lists it reads."""
