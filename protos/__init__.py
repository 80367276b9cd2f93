"""Wire format of the federation: the .proto, its generated code and the codec using it."""
