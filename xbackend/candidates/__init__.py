"""Release candidates against their original: tensors matched and measured, their nodes judged
at the precision they declare, their events named, and the precision advice (its modules are
imported by their full path; compare orchestrates and calls them)."""
