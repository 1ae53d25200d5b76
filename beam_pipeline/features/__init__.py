"""The optional features, each a folder of its local and Beam parts; engines/ and cli/ wire them in."""
