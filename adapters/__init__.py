"""Sources: each module turns one provider's data into ``checker`` model objects."""
