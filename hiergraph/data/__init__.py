"""Signal hierarchies as PyG data, and their builders."""
