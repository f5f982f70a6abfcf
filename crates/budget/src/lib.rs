//! lab-budget
