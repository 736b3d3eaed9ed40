"""jaxconv's implementation. Private: import from ``jaxconv`` instead."""
