"""Item kinds behind one protocol (``protocol``): windows, packed rows and mixtures, one subpackage each."""
