"""How `streambatch.prepare_store` runs: one store (`one`), a corpus folder of the plan's parts (`corpus`), on Ray (`on_ray`)."""
