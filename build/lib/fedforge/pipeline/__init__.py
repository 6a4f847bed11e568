"""The round as two pipelines of small stages (DESIGN idea 2): stage protocols, codecs."""
