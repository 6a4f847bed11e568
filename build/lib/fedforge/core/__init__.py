"""The ground floor: flat parameters, derived randomness, errors, the wire format."""
