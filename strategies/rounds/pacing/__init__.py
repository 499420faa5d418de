"""How a run's rounds are paced over an unequal fleet: the fleet model, its virtual clock, staleness, participation."""
