//! lab-corpus
